#!/usr/bin/env python3
"""Runs every `joule ...` command of the README's code blocks through the real CLI's parser.

usage: readme_examples.py README.md path/to/joule

Each command (a line starting with "joule ", with backslash continuations, comments after
"#" dropped) has its placeholders filled (ID -> 1, NAME -> demo, FILE/F -> x.html, ...) and
is run with JOULE_PARSE_ONLY=1: the CLI parses and checks the flags and runs nothing. Every
command must exit 0; the test fails, naming the README line, for any that does not, and
when the README has fewer than 10 commands (the extraction broke).
"""
import os
import re
import shlex
import subprocess
import sys

PLACEHOLDERS = {"ID": "1", "NAME": "demo", "FILE": "x.html", "F": "x.html", "N": "2",
                "KEY=VALUE": "sweep=demo", "S": "60"}


def commands(readme):
    lines = open(readme, encoding="utf-8").read().split("\n")
    in_code = False
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            in_code = not in_code
            i += 1
            continue
        stripped = line.strip()
        second = stripped.split()[1] if len(stripped.split()) > 1 else ""
        # A command: `joule` and a subcommand or flag (not a diagram's "joule (CLI) -->").
        if ((in_code or line.startswith("    ")) and stripped.startswith("joule ")
                and (second[:1].isalpha() or second.startswith("-"))):
            start = i + 1
            text = stripped
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            out.append((start, text))
        i += 1
    return out


def fill(text):
    text = re.sub(r"\s#.*$", "", text)            # a trailing comment
    text = text.split(" && ")[0].split(" | ")[0]  # the first command of a chain
    words = shlex.split(text)
    filled = []
    for w in words:
        if w in PLACEHOLDERS:
            w = PLACEHOLDERS[w]
        # Optional-argument brackets ("[--html F]"): drop them; a value that is a YAML
        # list ("workers=[1, 2]") stays.
        if (w.startswith("[") or w.endswith("]")) and "=[" not in w:
            continue
        filled.append(w)
    return filled


def main():
    readme, joule = sys.argv[1], sys.argv[2]
    found = commands(readme)
    failures = []
    env = dict(os.environ, JOULE_PARSE_ONLY="1")
    for line, text in found:
        argv = fill(text)
        r = subprocess.run([joule] + argv[1:], env=env, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            failures.append(f"README line {line}: `{text}` exits {r.returncode}: "
                            f"{(r.stderr or r.stdout).strip().splitlines()[:1]}")
    print(f"readme_examples: {len(found)} commands, {len(failures)} failed")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    if len(found) < 10:
        print("FAIL: fewer than 10 `joule` commands found: the extraction broke", file=sys.stderr)
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
