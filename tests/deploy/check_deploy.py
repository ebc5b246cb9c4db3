#!/usr/bin/env python3
"""Checks of deploy/ that need no container (static) and against a live Prometheus (promql).

  check_deploy.py static  [--root REPO]
      Grafana dashboards: valid dashboard JSON (uid, title, schemaVersion, unique panel ids,
      grid positions, data source uids the provisioning defines, every variable used and
      every used variable defined); docker-compose.yml: images, Dockerfiles, secrets and
      volumes that exist; Kubernetes manifests: every document has apiVersion, kind and
      metadata.name, every kustomization names files that exist, every pod runs as non-root
      with resources, every Secret and claim it mounts is one the manifests or the README
      name. One line per problem; exit 1 if any.

  check_deploy.py promql --prometheus URL --job ID [--root REPO]
      Evaluates EVERY PromQL expression of every dashboard panel and variable, recording
      rule and alert against Prometheus's HTTP API (Grafana's $job is the given job,
      $__rate_interval 1m, $__range 5m): each must parse, and each panel's and recording
      rule's must return data. Alerts must parse and evaluate (they are quiet when healthy).
      One line per expression; exit 1 if any fails.
"""
import argparse
import json
import pathlib
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

import yaml

GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
VAR_RE = re.compile(r"\$\{?(\w+)\}?")


def dashboards(root):
    return sorted((root / "deploy/grafana/dashboards").glob("*.json"))


def dashboard_exprs(board):
    """(where, expr, must_return_data) for every panel target and query variable.

    A panel whose series need hardware the containers lack (a BMC: its description says
    "Empty without") must evaluate, but may return nothing."""
    out = []
    for panel in board.get("panels", []):
        needs_data = "Empty without" not in panel.get("description", "")
        for t in panel.get("targets", []):
            out.append((f'{board["uid"]} panel {panel["id"]} "{panel["title"]}" {t["refId"]}', t["expr"], needs_data))
    for v in board.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q.strip())
            expr = f"group by ({m.group(2)}) ({m.group(1)})" if m else q
            out.append((f'{board["uid"]} variable {v["name"]}', expr, True))
    return out


def check_dashboards(root, problems):
    ds_uids = set()
    for f in (root / "deploy/grafana/provisioning/datasources").glob("*.yml"):
        for ds in yaml.safe_load(f.read_text()).get("datasources", []):
            ds_uids.add(ds["uid"])
    if not ds_uids:
        problems.append("grafana: no provisioned data source")
    uids = set()
    for f in dashboards(root):
        try:
            board = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            problems.append(f"{f.name}: not JSON: {e}")
            continue
        for key in ("uid", "title", "schemaVersion", "panels"):
            if key not in board:
                problems.append(f"{f.name}: no {key}")
        if not isinstance(board.get("schemaVersion"), int) or board["schemaVersion"] < 30:
            problems.append(f"{f.name}: schemaVersion {board.get('schemaVersion')!r} (want an int >= 30)")
        if board.get("uid") in uids:
            problems.append(f"{f.name}: uid {board.get('uid')} used twice")
        uids.add(board.get("uid"))
        ids = [p.get("id") for p in board.get("panels", [])]
        if len(ids) != len(set(ids)) or None in ids:
            problems.append(f"{f.name}: panel ids not unique: {ids}")
        defined = {v["name"] for v in board.get("templating", {}).get("list", [])}
        used = set()
        for p in board.get("panels", []):
            where = f'{f.name} panel {p.get("id")} "{p.get("title")}"'
            gp = p.get("gridPos", {})
            if not all(isinstance(gp.get(k), int) for k in ("x", "y", "w", "h")) or gp["x"] + gp["w"] > 24:
                problems.append(f"{where}: bad gridPos {gp}")
            if not p.get("targets"):
                problems.append(f"{where}: no query")
            for obj in [p] + p.get("targets", []):
                uid = obj.get("datasource", {}).get("uid")
                if uid not in ds_uids:
                    problems.append(f"{where}: data source uid {uid!r} is not provisioned ({sorted(ds_uids)})")
            for t in p.get("targets", []):
                if not t.get("expr", "").strip():
                    problems.append(f"{where}: empty expr")
                used |= set(VAR_RE.findall(t.get("expr", ""))) - GRAFANA_BUILTINS
        for v in sorted(used - defined):
            problems.append(f"{f.name}: ${v} is used but not defined")
        for v in sorted(defined - used):
            problems.append(f"{f.name}: variable {v} is defined but no panel uses it")
    if not uids:
        problems.append("grafana: no dashboard")


def check_compose(root, problems):
    f = root / "deploy/docker-compose.yml"
    base = yaml.safe_load(f.read_text())
    ha = yaml.safe_load((root / "deploy/docker-compose.ha.yml").read_text())
    for name in ha["services"]:
        if name not in base["services"] and "image" not in ha["services"][name]:
            problems.append(f"docker-compose.ha.yml: new service {name} has no image")
    check_compose_file(f, "docker-compose.yml", base, problems)
    # The override merged as tests/deploy/compose_run.py (beside this file) merges it.
    from compose_run import merge
    check_compose_file(f, "docker-compose.yml + docker-compose.ha.yml", merge(base, ha), problems)


def check_compose_file(f, label, c, problems):
    secrets, volumes = set(c.get("secrets", {})), set(c.get("volumes", {}))
    for name, s in c["services"].items():
        where = f"{label}: service {name}"
        if "image" not in s:
            problems.append(f"{where}: no image")
        b = s.get("build")
        if b and not (f.parent / b["context"] / b["dockerfile"]).is_file():
            problems.append(f"{where}: no Dockerfile {b['dockerfile']}")
        for sec in s.get("secrets", []):
            if sec not in secrets:
                problems.append(f"{where}: secret {sec} not defined")
        for vol in s.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                if not (f.parent / src).exists():
                    problems.append(f"{where}: {src} does not exist")
            elif src not in volumes:
                problems.append(f"{where}: volume {src} not defined")


def render_kustomization(path):
    """Every document a kustomization's resources hold (recursively), as fresh copies."""
    out = []
    for r in yaml.safe_load(path.read_text()).get("resources", []):
        target = path.parent / r
        if target.is_dir():
            out += render_kustomization(target / "kustomization.yaml")
        else:
            out += [d for d in yaml.safe_load_all(target.read_text()) if d is not None]
    return out


def apply_json_patch(doc, ops):
    """RFC 6902's add and replace (the operations the overlays use), in place; raises on a
    path that does not exist."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] not in ("add", "replace"):
            raise ValueError(f"operation {op['op']} is not checked here")
        if isinstance(parent, list):
            if last == "-" and op["op"] == "add":
                parent.append(op["value"])
            elif op["op"] == "add":
                parent.insert(int(last), op["value"])
            else:
                parent[int(last)] = op["value"]
        elif op["op"] == "replace" and last not in parent:
            raise KeyError(op["path"])
        else:
            parent[last] = op["value"]


def check_k8s(root, problems):
    k8s = root / "deploy/k8s"
    docs = {}
    for f in sorted(k8s.rglob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d is None:
                continue
            rel = f.relative_to(k8s)
            if f.name == "kustomization.yaml":
                for r in d.get("resources", []):
                    if not (f.parent / r).exists():
                        problems.append(f"k8s/{rel}: resource {r} does not exist")
                continue
            for key in ("apiVersion", "kind"):
                if key not in d:
                    problems.append(f"k8s/{rel}: a document without {key}")
            if not d.get("metadata", {}).get("name"):
                problems.append(f"k8s/{rel}: a {d.get('kind')} without metadata.name")
            docs.setdefault(d.get("kind"), []).append((rel, d))
    claims = {d["metadata"]["name"] for _, d in docs.get("PersistentVolumeClaim", [])}
    # Created by the user (README "Deploy", "High availability").
    secrets_named = {"joule-tls", "joule-tokens", "joule-postgres"}

    def pod_specs(d):
        spec = d.get("spec", {})
        if "template" in spec:
            yield spec["template"]["spec"]
        for rj in spec.get("replicatedJobs", []):
            yield rj["template"]["spec"]["template"]["spec"]

    # Overlays' inline JSON patches, applied to what their resources render: the patched
    # workloads are checked like the others.
    for f in sorted(k8s.rglob("kustomization.yaml")):
        overlay = yaml.safe_load(f.read_text())
        if not overlay.get("patches"):
            continue
        rendered = render_kustomization(f)
        for patch in overlay["patches"]:
            target = patch.get("target", {})
            hits = [d for d in rendered if d.get("kind") == target.get("kind")
                    and d.get("metadata", {}).get("name") == target.get("name")]
            rel = f.relative_to(k8s)
            if not hits:
                problems.append(f"k8s/{rel}: patch target {target} is in none of its resources")
            for d in hits:
                try:
                    apply_json_patch(d, yaml.safe_load(patch["patch"]))
                except (KeyError, IndexError, TypeError, ValueError) as e:
                    problems.append(f"k8s/{rel}: patch of {target.get('name')} does not apply: {e!r}")
                docs.setdefault(d["kind"], []).append((rel.parent / "(rendered)", d))
    for kind in ("StatefulSet", "Deployment", "JobSet"):
        for rel, d in docs.get(kind, []):
            for pod in pod_specs(d):
                where = f"k8s/{rel}: {kind} {d['metadata']['name']}"
                if not pod.get("securityContext", {}).get("runAsNonRoot"):
                    problems.append(f"{where}: pods may run as root")
                for c in pod.get("containers", []):
                    if not c.get("image") or not c.get("resources"):
                        problems.append(f"{where}: container {c.get('name')} without image or resources")
                for v in pod.get("volumes", []):
                    if "secret" in v and v["secret"]["secretName"] not in secrets_named:
                        problems.append(f"{where}: Secret {v['secret']['secretName']} is named nowhere")
                    pvc = v.get("persistentVolumeClaim", {}).get("claimName")
                    if pvc and pvc not in claims:
                        problems.append(f"{where}: claim {pvc} is not defined")
    gpu = [rel for kind in ("Deployment", "JobSet") for rel, d in docs.get(kind, [])
           if "nvidia.com/gpu" in json.dumps(d)]
    if not gpu:
        problems.append("k8s: no worker requests nvidia.com/gpu")


def static(args):
    root = pathlib.Path(args.root)
    problems = []
    check_dashboards(root, problems)
    check_compose(root, problems)
    check_k8s(root, problems)
    for p in problems:
        print(f"check_deploy: {p}")
    print(f"check_deploy: static: {len(problems)} problem(s)")
    return 1 if problems else 0


def rule_exprs(root):
    out = []
    for f in sorted((root / "deploy/prometheus/rules").glob("*.yml")):
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                if "record" in r:
                    out.append((f"rule {r['record']}", r["expr"], True))
                else:
                    out.append((f"alert {r['alert']}", r["expr"], False))
    return out


def query(url, expr):
    data = urllib.parse.urlencode({"query": expr}).encode()
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/api/v1/query", data, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read() or b'{"status":"error","error":"HTTP %d"}' % e.code)


def promql(args):
    root = pathlib.Path(args.root)
    exprs = []
    for f in dashboards(root):
        exprs += dashboard_exprs(json.loads(f.read_text()))
    exprs += rule_exprs(root)
    failed = 0
    for where, expr, want_data in exprs:
        e = (expr.replace("${job}", args.job).replace("$job", args.job)
             .replace("$__rate_interval", "1m").replace("$__interval", "15s").replace("$__range", "5m"))
        r = query(args.prometheus, e)
        if r.get("status") != "success":
            failed += 1
            print(f"FAIL {where}: {r.get('error')}: {e}")
        elif want_data and not r["data"]["result"]:
            failed += 1
            print(f"FAIL {where}: no data: {e}")
        else:
            print(f"ok   {where}: {len(r['data']['result'])} series")
    print(f"check_deploy: promql: {len(exprs)} expressions, {failed} failed")
    return 1 if failed or not exprs else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["static", "promql"])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parents[2]))
    ap.add_argument("--prometheus")
    ap.add_argument("--job")
    args = ap.parse_args()
    if args.mode == "promql" and not (args.prometheus and args.job):
        ap.error("promql needs --prometheus and --job")
    return static(args) if args.mode == "static" else promql(args)


if __name__ == "__main__":
    sys.exit(main())
