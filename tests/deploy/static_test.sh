#!/usr/bin/env bash
# deploy/ without containers: promtool checks and rule unit tests, yamllint over deploy/,
# ShellCheck (warnings and errors) over every shell script, and check_deploy.py static
# (dashboards, compose file, Kubernetes manifests). ctest deploy_static_test, label deploy.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in promtool yamllint shellcheck python3; do
  command -v "$tool" >/dev/null || { echo "static_test: $tool is missing (bash scripts/install-deps.sh)"; exit 1; }
done
set -x
promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/rules/*.yml
promtool test rules deploy/prometheus/tests/*.yml
yamllint -c deploy/.yamllint deploy/
mapfile -t scripts < <(git ls-files '*.sh' '*.sbatch' 2>/dev/null || find . -name '*.sh' -not -path './build*')
shellcheck -S warning "${scripts[@]}"
python3 tests/deploy/check_deploy.py static
