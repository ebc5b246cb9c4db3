#!/usr/bin/env python3
"""Runs a command and then prints `cpu_seconds=S`: the user + sys CPU time of the command
and every descendant it waited for (getrusage(RUSAGE_CHILDREN)). Used by compare.sh to
charge the PyTorch reference with all of its processes' CPU time.

usage: cputime.py COMMAND [ARG...]
"""
import resource
import subprocess
import sys

if len(sys.argv) < 2:
    sys.exit(__doc__)
rc = subprocess.run(sys.argv[1:]).returncode
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"cpu_seconds={usage.ru_utime + usage.ru_stime:.3f}", flush=True)
sys.exit(rc)
