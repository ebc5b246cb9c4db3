#!/usr/bin/env bash
# Test hosts on one machine: N network namespaces joined by veth pairs to one bridge, so
# that a gang's traffic crosses a (shaped) network path as it would between machines.
#
#   netns-hosts.sh up N [--rate R] [--loss P]   create hosts 1..N, print "ready RUN NET",
#                                               then hold them until this process gets
#                                               SIGTERM or SIGINT, or its parent exits;
#                                               then remove them
#   netns-hosts.sh down [RUN]                   stop run RUN (default: every run of ours)
#   netns-hosts.sh exec HOST cmd...             run cmd in host HOST (1..N); keeps the pid
#   netns-hosts.sh addr HOST                    print host HOST's address
#   netns-hosts.sh link HOST up|down            set host HOST's link up or down (its veth's
#                                               bridge end, in the root namespace): a cable
#                                               pulled; nothing in the host is told
#   netns-hosts.sh partition HOST               drop every packet between host HOST and the
#                                               other hosts (iptables inside HOST); the root
#                                               namespace (the caller, NET.254) still
#                                               reaches it, so a test can watch it
#   netns-hosts.sh heal HOST                    undo `partition HOST`
#   netns-hosts.sh rate HOST R|off              shape both directions of host HOST's link
#                                               to R (tc tbf on eth0 inside it and on its
#                                               veth's bridge end), or remove the shaping
#
# RUN is the pid of the `up` process (exec, addr, link, partition and heal take it from
# $JNH_RUN, or find the one live run). NET is the run's own /24 of RFC 2544's benchmarking
# range 198.18.0.0/15 (198.18.0, then 198.18.1, ...: the first one no live run holds, so
# that runs at the same time, e.g. under ctest -j, never share a route in the root
# namespace). Host i is the namespace jnh-RUN-i, with `lo` up and eth0 at NET.i/24; eth0's
# peer jnhRUNhi is a port of the bridge jnhRUNbr in the root namespace, which holds
# NET.254/24 so that the caller (in the root namespace) reaches every host. --rate shapes
# each host's egress with `tc tbf` (a tc rate: 1gbit, 100mbit); --loss drops that fraction
# (0..1) of each host's incoming packets with iptables' `statistic` match inside the
# namespace. This kernel has no netem, so no added delay.
#
# Only this harness's own namespaces and links are touched: names carry the prefix and the
# run's pid. A trap removes them on any exit of `up` (processes still inside a namespace
# are killed first: the caller started them there); a set whose `up` process is gone (a
# killed run) is removed at the next `up` or `down`. Nothing is routed anywhere else: the
# hosts have no default route and the root namespace only the bridge's /24.
#
# Needs root, `ip` and `tc` (Debian: iproute2) and, for --loss, `iptables`. Without them it
# says so in one line and exits 77 (the tests that use it skip).
set -euo pipefail

readonly PREFIX=jnh
readonly ROOT_ADDR=254
readonly LOCK=/run/lock/netns-hosts.lock

die() { echo "netns-hosts: $*" >&2; exit 2; }
skip() { echo "netns-hosts: skipped: $*" >&2; exit 77; }

need_tools() {
  [ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, veth and tc)"
  command -v ip >/dev/null || skip "needs ip (Debian package iproute2)"
  command -v tc >/dev/null || skip "needs tc (Debian package iproute2)"
}

# The runs whose namespaces exist, one pid a line.
runs() {
  ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^${PREFIX}-\([0-9]\+\)-[0-9]\+$/\1/p" |
    sort -u
}

# True when pid $1 is a live `up` of this script.
alive() {
  [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q "netns-hosts.sh up"
}

# Removes run $1's namespaces (killing what still runs inside), links and bridge.
remove_run() {
  local run=$1 ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}-${run}-[0-9]\+$" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
      for _ in $(seq 50); do
        [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
    ip netns del "$ns" 2>/dev/null || true
  done
  local link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
                grep "^${PREFIX}${run}\(br\|h[0-9]\+\)$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
}

clean_stale() {
  local run
  for run in $(runs); do
    alive "$run" || remove_run "$run"
  done
  # Bridges and veths left without namespaces.
  local link run_of
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
                grep "^${PREFIX}[0-9]\+\(br\|h[0-9]\+\)$" || true); do
    run_of=$(echo "$link" | sed "s/^${PREFIX}\([0-9]\+\).*/\1/")
    alive "$run_of" || ip link del "$link" 2>/dev/null || true
  done
}

# The first /24 of 198.18.0.0/15 (as "198.18.X") whose .254 no interface here holds.
free_net() {
  local used second third
  used=$(ip -o -4 addr show 2>/dev/null | awk '{print $4}')
  for second in 18 19; do
    for third in $(seq 0 255); do
      grep -q "^198\.${second}\.${third}\.${ROOT_ADDR}/" <<<"$used" ||
        { echo "198.${second}.${third}"; return; }
    done
  done
  die "up: every /24 of 198.18.0.0/15 is taken"
}

# Run $1's /24 (as "198.18.X"), read from its bridge's address.
run_net() {
  ip -o -4 addr show dev "${PREFIX}${1}br" 2>/dev/null | awk '{print $4}' |
    sed -n "s/^\(198\.1[89]\.[0-9]\+\)\.${ROOT_ADDR}\/24$/\1/p"
}

# The one live run, or $JNH_RUN.
current_run() {
  if [ -n "${JNH_RUN:-}" ]; then echo "$JNH_RUN"; return; fi
  local live=()
  local run
  for run in $(runs); do alive "$run" && live+=("$run"); done
  [ ${#live[@]} -eq 1 ] || die "${#live[@]} live runs; set JNH_RUN to one of: ${live[*]:-none}"
  echo "${live[0]}"
}

# The token bucket for a tbf of rate R: 4 ms at that rate, at least 32 KiB. A fixed small
# bucket caps a fast link far below its rate (the qdisc refills it once per timer tick).
tbf_burst() {
  awk -v r="$1" 'BEGIN {
    n = r + 0; u = substr(r, length(n "") + 1)
    m = (u ~ /^k/) ? 1e3 : (u ~ /^m/) ? 1e6 : (u ~ /^g/) ? 1e9 : 1
    bytes_per_s = n * m / ((u ~ /bps$/) ? 1 : 8)
    b = bytes_per_s * 0.004; if (b < 32768) b = 32768
    printf "%d", b }'
}

cmd_up() {
  local n=${1:-}
  shift || true
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] ||
    die "up: want a host count from 1 to 200, got '${n}'"
  local rate="" loss=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --loss) loss=${2:?--loss needs a value}; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  need_tools
  if [ -n "$loss" ]; then
    command -v iptables >/dev/null || skip "--loss needs iptables (Debian package iptables)"
    [[ "$loss" =~ ^(0(\.[0-9]+)?|1(\.0+)?)$ ]] || die "up: --loss wants a fraction 0..1, got '$loss'"
  fi
  if [ -n "$rate" ]; then
    [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] ||
      die "up: --rate wants a tc rate such as 1gbit or 100mbit, got '$rate'"
  fi
  clean_stale

  local run=$$ parent=$PPID net
  local bridge="${PREFIX}${run}br"
  trap 'remove_run '"$run" EXIT
  trap 'exit 0' TERM INT HUP
  # Choosing a /24 and taking it is one step for concurrent runs.
  mkdir -p "$(dirname "$LOCK")"
  exec 9>"$LOCK"
  flock 9
  net=$(free_net)
  ip link add "$bridge" type bridge
  ip addr add "${net}.${ROOT_ADDR}/24" dev "$bridge"
  flock -u 9
  exec 9>&-
  ip link set "$bridge" up
  local i ns veth
  for i in $(seq 1 "$n"); do
    ns="${PREFIX}-${run}-${i}"
    veth="${PREFIX}${run}h${i}"
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$bridge" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "${net}.${i}/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ -n "$rate" ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$(tbf_burst "$rate")" \
        latency 50ms
    fi
    if [ -n "$loss" ]; then
      ip netns exec "$ns" iptables -A INPUT -i eth0 -m statistic --mode random \
        --probability "$loss" -j DROP
    fi
  done
  echo "ready ${run} ${net}"
  # Hold the hosts until a signal or until the parent (a test, a shell) has gone.
  # (The parent is gone when this process's parent pid changes: it was reparented.)
  while [ "$(awk '{print $4}' /proc/$$/stat)" = "$parent" ]; do
    sleep 0.5 &
    wait $! || true
  done
}

cmd_down() {
  need_tools
  local run
  local targets=("$@")
  [ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(runs)
  for run in "${targets[@]}"; do
    [[ "$run" =~ ^[0-9]+$ ]] || die "down: a run is a pid, got '$run'"
    if alive "$run"; then
      kill -TERM "$run"
      for _ in $(seq 100); do alive "$run" || break; sleep 0.1; done
    fi
    remove_run "$run"
  done
  clean_stale
}

host_ns() {
  local host=${1:-}
  [[ "$host" =~ ^[0-9]+$ ]] || die "want a host number, got '${host}'"
  local ns
  ns="${PREFIX}-$(current_run)-${host}"
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "no host ${host} (namespace ${ns})"
  echo "$ns"
}

cmd_exec() {
  need_tools
  local ns
  ns=$(host_ns "${1:-}")
  shift
  [ $# -gt 0 ] || die "exec: no command"
  exec ip netns exec "$ns" "$@"
}

cmd_link() {
  need_tools
  local host=${1:-} state=${2:-}
  [[ "$state" == up || "$state" == down ]] || die "link: want up or down, got '${state}'"
  host_ns "$host" >/dev/null
  ip link set "${PREFIX}$(current_run)h${host}" "$state"
}

# The iptables rules (without -A/-I/-D) that cut a host of the current run off from the
# other hosts.
partition_rules() {
  local net
  net=$(run_net "$(current_run)")
  [ -n "$net" ] || die "run $(current_run) has no bridge address"
  echo "INPUT -i eth0 ! -s ${net}.${ROOT_ADDR} -j DROP"
  echo "OUTPUT -o eth0 ! -d ${net}.${ROOT_ADDR} -j DROP"
}

cmd_partition() {
  need_tools
  command -v iptables >/dev/null || skip "partition needs iptables (Debian package iptables)"
  local ns rule
  ns=$(host_ns "${1:-}")
  while read -r rule; do
    # shellcheck disable=SC2086
    ip netns exec "$ns" iptables -C $rule 2>/dev/null ||
      ip netns exec "$ns" iptables -I $rule
  done < <(partition_rules)
}

cmd_heal() {
  need_tools
  command -v iptables >/dev/null || skip "heal needs iptables (Debian package iptables)"
  local ns rule
  ns=$(host_ns "${1:-}")
  while read -r rule; do
    # shellcheck disable=SC2086
    while ip netns exec "$ns" iptables -C $rule 2>/dev/null; do
      ip netns exec "$ns" iptables -D $rule
    done
  done < <(partition_rules)
}

cmd_rate() {
  need_tools
  local host=${1:-} rate=${2:-}
  local ns veth
  ns=$(host_ns "$host")
  veth="${PREFIX}$(current_run)h${host}"
  if [ "$rate" = off ]; then
    ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
    tc qdisc del dev "$veth" root 2>/dev/null || true
    return 0
  fi
  [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] ||
    die "rate: want a tc rate such as 100mbit, or off, got '${rate}'"
  ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" \
    burst "$(tbf_burst "$rate")" latency 50ms
  tc qdisc replace dev "$veth" root tbf rate "$rate" burst "$(tbf_burst "$rate")" latency 50ms
}

cmd_addr() {
  local host=${1:-}
  [[ "$host" =~ ^[0-9]+$ ]] && [ "$host" -ge 1 ] || die "addr: want a host number, got '${host}'"
  local net
  net=$(run_net "$(current_run)")
  [ -n "$net" ] || die "run $(current_run) has no bridge address"
  echo "${net}.${host}"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  addr) shift; cmd_addr "$@" ;;
  link) shift; cmd_link "$@" ;;
  partition) shift; cmd_partition "$@" ;;
  heal) shift; cmd_heal "$@" ;;
  rate) shift; cmd_rate "$@" ;;
  *) die "usage: netns-hosts.sh up N [--rate R] [--loss P] | down [RUN] | exec HOST cmd... | addr HOST | link HOST up|down | partition HOST | heal HOST" ;;
esac
