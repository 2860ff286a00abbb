#!/usr/bin/env bash
# Limit the links of a multi-node local SLURM (start.sh with LARTPC_SLURM_NODES >= 2) to
# RATE, as a slower network would: a tbf qdisc on both ends of every node's veth pair,
# so traffic leaving a node (its eth0) and entering it (the bridge's lartpc-vI) are both
# shaped. tbf, not netem (netem is not built into every kernel). stop.sh removes the
# links and their qdiscs with them; `throttle.sh off` removes only the qdiscs.
#
# Usage: jobs/slurm/local/throttle.sh RATE | off
#   RATE as tc writes it: 200mbit, 1gbit, 50mbit (bits per second)
# Environment:
#   LARTPC_SLURM_NET      name prefix of the namespaces and links (netns.sh; default lartpc)
#   LARTPC_TBF_BURST      bucket size (default 64kb: kilobytes in tc's units)
#   LARTPC_TBF_LATENCY    longest a packet may queue before it is dropped (default 50ms)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=jobs/slurm/local/netns.sh
source "$here/netns.sh"

die() { echo "throttle.sh: $*" >&2; exit 2; }

[[ $# == 1 ]] || die "usage: throttle.sh RATE (e.g. 200mbit) | off"
rate=$1
[[ $rate == off || $rate =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] \
    || die "RATE $rate: expected a tc rate such as 200mbit, 1gbit or off"
[[ $(id -u) == 0 ]] || die "needs root (tc on the namespaces' links)"
burst=${LARTPC_TBF_BURST:-64kb}
latency=${LARTPC_TBF_LATENCY:-50ms}

n=0
while ip netns list | grep -qw "$(node_name $((n + 1)))"; do n=$((n + 1)); done
(( n >= 2 )) || die "no multi-node cluster: namespace $(node_name 1) or $(node_name 2) missing (start.sh with LARTPC_SLURM_NODES=2)"

for ((i = 1; i <= n; i++)); do
    ns=$(node_name "$i") host_end=${net}-v$i
    if [[ $rate == off ]]; then
        tc qdisc del dev "$host_end" root 2>/dev/null || true
        tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
    else
        tc qdisc replace dev "$host_end" root tbf rate "$rate" burst "$burst" latency "$latency"
        tc -n "$ns" qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency "$latency"
    fi
done
echo "throttle.sh: $n node(s): ${rate/off/unlimited} (tbf burst $burst latency $latency) on ${net}-v1..$n and each node's eth0" >&2
