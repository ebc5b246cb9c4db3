#!/usr/bin/env bash
# Makes the secrets deploy/docker-compose.yml reads, in deploy/secrets/ (a directory only
# its owner may enter; the files in it are readable by the containers' user, uid 10001):
#   join-token              the token workers present to join (--join-token-file)
#   client-tokens           "NAME TOKEN" lines the coordinator accepts (--client-tokens-file)
#   client-token            the token of the first client, for `joule --token-file`
#   grafana-admin-password  Grafana's admin password
#   postgres-password       the PostgreSQL role joule's (docker-compose.ha.yml)
# Existing files are kept (pass --force to make new ones). Tokens: 32 random bytes, hex.
set -euo pipefail
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
force=0
[[ ${1:-} == --force ]] && force=1
mkdir -p "$dir"
chmod 700 "$dir"
token() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
write() {  # write NAME CONTENT
  if [[ -s $dir/$1 && $force == 0 ]]; then return; fi
  (umask 022; printf '%s\n' "$2" >"$dir/$1.tmp")
  mv "$dir/$1.tmp" "$dir/$1"
}
write join-token "$(token)"
write client-token "$(token)"
write client-tokens "$(printf 'admin %s' "$(cat "$dir/client-token")")"
write grafana-admin-password "$(token | head -c 24)"
write postgres-password "$(token)"
echo "make-secrets: $dir (join-token, client-tokens, client-token, grafana-admin-password, postgres-password)"
