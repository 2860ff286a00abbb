# shellcheck shell=bash
# Network for a multi-node local SLURM (sourced by start.sh and stop.sh): one bridge in
# this namespace carrying the controller's address, and per node a network namespace
# joined to it by a veth pair, with its own address, /etc/hosts and resolv.conf. Traffic
# between nodes crosses the veths (never loopback), so `tc` on them shapes it.
#
# Settings (all overridable, so two clusters on one host do not collide):
#   LARTPC_SLURM_NET     name prefix of the bridge, namespaces and links (default lartpc)
#   LARTPC_SLURM_SUBNET  first three octets of the /24 (default 10.77.0)

net=${LARTPC_SLURM_NET:-lartpc}
subnet=${LARTPC_SLURM_SUBNET:-10.77.0}
bridge=${net}-br
ctl_addr=$subnet.1

# node_name I, node_addr I: the I-th node (1-based)
node_name() { echo "${net}-n$1"; }
node_addr() { echo "$subnet.$((10 + $1))"; }

# net_up N DIR: the bridge, N namespaces with their veths, and DIR/etc-N/{hosts,resolv.conf}
net_up() {
    local n=$1 dir=$2 i name
    net_down
    ip link add "$bridge" type bridge
    ip addr add "$ctl_addr/24" dev "$bridge"
    ip link set "$bridge" up
    for ((i = 1; i <= n; i++)); do
        name=$(node_name "$i")
        ip netns add "$name"
        ip link add "${net}-v$i" type veth peer name eth0 netns "$name"
        ip link set "${net}-v$i" master "$bridge" up
        ip -n "$name" addr add "$(node_addr "$i")/24" dev eth0
        ip -n "$name" link set eth0 up
        ip -n "$name" link set lo up
        mkdir -p "$dir/etc-$i"
        # The host's resolver is unreachable from a node: name lookups would each wait
        # out a timeout (torch's c10d waits 10 s per lookup). Nodes resolve from hosts.
        {
            echo "127.0.0.1 localhost"
            echo "$ctl_addr $(hostname -s) ${net}-ctl"
            for ((j = 1; j <= n; j++)); do echo "$(node_addr "$j") $(node_name "$j")"; done
        } > "$dir/etc-$i/hosts"
        : > "$dir/etc-$i/resolv.conf"
    done
}

# node_exec I DIR CMD...: run CMD in node I's namespaces: its network, its own mount
# namespace (hosts and resolv.conf bound over /etc; /sys kept, which `ip netns exec`
# would remount and so hide the cgroups slurmd reads) and its host name.
node_exec() {
    local i=$1 dir=$2
    shift 2
    # shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
    nsenter --net="/run/netns/$(node_name "$i")" unshare --mount --uts -- bash -c '
        hostname "$1" && mount --bind "$2/hosts" /etc/hosts \
            && mount --bind "$2/resolv.conf" /etc/resolv.conf && shift 2 && exec "$@"' \
        _ "$(node_name "$i")" "$dir/etc-$i" "$@"
}

# net_down: remove every namespace and link net_up made under this prefix, however
# many nodes it started (also after a crash).
net_down() {
    local ns link
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^${net}-n[0-9]+\$"); do
        ip netns del "$ns" 2>/dev/null || true
    done
    for link in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' \
                  | grep -E "^${net}-v[0-9]+\$"); do
        ip link del "$link" 2>/dev/null || true
    done
    ip link del "$bridge" 2>/dev/null || true
}
