#!/usr/bin/env python3
"""Runs deploy/docker-compose.yml's services with plain `podman run`, for hosts whose
podman-compose cannot (Debian 12's 1.0.3 adds a bridge network to network_mode: host).

  compose_run.py --file deploy/docker-compose.yml --project P up SERVICE...
  compose_run.py --file ... --project P down            (containers and named volumes)

Several --file options are merged in order, as Compose merges override files (a mapping
merged key by key; a service's secrets, volumes, depends_on and profiles as unions; any other
value, command too, replaced by the later file's).

It reads the file the way Compose does for the keys the file uses (image, command,
environment, volumes, secrets, network_mode, restart, depends_on, profiles; ${VAR} and
${VAR:-default} from the environment; YAML merge keys) and refuses any other key, so the
file cannot grow a setting that this runner silently drops. Containers are P_SERVICE,
named volumes P_VOLUME, file secrets bind-mounted read-only at /run/secrets/NAME.
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys

import yaml

SUPPORTED = {"image", "command", "environment", "volumes", "secrets", "network_mode",
             "restart", "depends_on", "profiles", "build", "deploy"}
INTERP = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(value):
    if isinstance(value, str):
        return INTERP.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


# A service's lists that Compose merges as sets (the override adds to the base's); its
# other lists (command, entrypoint) are replaced.
UNION_LISTS = {"secrets", "volumes", "depends_on", "profiles"}


def merge(base, override, key=None):
    """Compose's override merge for the keys these files use: mappings key by key, the lists
    of UNION_LISTS as ordered unions, anything else replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base[k], v, k) if k in base else v
        return out
    if key in UNION_LISTS and isinstance(base, list) and isinstance(override, list):
        return base + [v for v in override if v not in base]
    return override


def podman(*args, check=True):
    return subprocess.run(["podman", *args], check=check, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def run_args(project, name, svc, compose_dir, top):
    unknown = set(svc) - SUPPORTED
    if unknown:
        sys.exit(f"compose_run: service {name}: unsupported keys {sorted(unknown)}")
    args = ["run", "-d", "--name", f"{project}_{name}", "--label", f"joule.compose.project={project}"]
    if svc.get("network_mode"):
        args += ["--network", svc["network_mode"]]
    if svc.get("restart"):
        args += ["--restart", {"unless-stopped": "always"}.get(svc["restart"], svc["restart"])]
    for k, v in (svc.get("environment") or {}).items():
        args += ["-e", f"{k}={v}"]
    for vol in svc.get("volumes") or []:
        src, dst, *mode = vol.split("#")[0].strip().split(":")
        if src.startswith("."):
            src = str((compose_dir / src).resolve())
        elif src not in (top.get("volumes") or {}):
            sys.exit(f"compose_run: service {name}: volume {src} is not defined")
        else:
            src = f"{project}_{src}"
        args += ["-v", ":".join([src, dst, *mode])]
    for s in svc.get("secrets") or []:
        path = (compose_dir / top["secrets"][s]["file"]).resolve()
        args += ["-v", f"{path}:/run/secrets/{s}:ro"]
    return args + [svc["image"], *(svc.get("command") or [])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", required=True, action="append",
                    help="a compose file; several are merged in order")
    ap.add_argument("--project", required=True)
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("services", nargs="*")
    a = ap.parse_args()
    path = pathlib.Path(a.file[0]).resolve()  # relative paths: from the first file's folder
    top = {}
    for f in a.file:
        top = merge(top, interpolate(yaml.safe_load(pathlib.Path(f).read_text())))
    services = top["services"]
    if a.action == "down":
        ids = podman("ps", "-aq", "--filter", f"label=joule.compose.project={a.project}").stdout.split()
        if ids:
            podman("rm", "-f", "-v", "-t", "5", *ids, check=False)  # -v: anonymous volumes too
        for v in top.get("volumes") or {}:
            podman("volume", "rm", "-f", f"{a.project}_{v}", check=False)
        return 0
    wanted = a.services or [n for n, s in services.items() if not s.get("profiles")]
    started = set()

    def up(name):
        if name in started:
            return
        for dep in services[name].get("depends_on") or []:
            if dep in wanted:
                up(dep)
        r = podman(*run_args(a.project, name, services[name], path.parent, top), check=False)
        if r.returncode != 0:
            sys.exit(f"compose_run: {name}: podman run failed: {r.stdout.strip()}")
        started.add(name)
        print(f"compose_run: started {a.project}_{name}")

    for name in wanted:
        if name not in services:
            sys.exit(f"compose_run: no service {name}")
        up(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
