#!/usr/bin/env bash
# Start a SLURM cluster on this machine, for tests and trying the job scripts: one node
# on this host (the default), or N nodes, each in its own network namespace with its
# own address on a bridge (netns.sh), so ranks on different nodes talk over real links.
#
# Installs Debian's slurm-wlm and munge with apt-get when missing, writes a minimal
# slurm.conf into a state folder (never /etc/slurm, so a real cluster's config is left
# alone), starts munged, slurmctld and one slurmd per node, and waits until every node
# is idle. Needs root: slurmd runs jobs as their submitting user, munged needs its key
# and the namespaces need CAP_NET_ADMIN.
#
# Usage: jobs/slurm/local/start.sh
#   Then: export SLURM_CONF=$LARTPC_SLURM_DIR/slurm.conf   (printed on the last line)
# Environment:
#   LARTPC_SLURM_DIR      state, logs and slurm.conf (default /var/tmp/lartpc-slurm)
#   LARTPC_SLURM_NODES    nodes (default 1: this host; 2 or more: network namespaces)
#   LARTPC_SLURM_NET, LARTPC_SLURM_SUBNET  names and /24 of the namespaces (netns.sh)
#   LARTPC_SLURM_PORT     slurmctld's port; slurmd's is the next one (default 6817)
#   LARTPC_SLURM_TIMEOUT  seconds to wait for the nodes to become idle (default 60)
#   LARTPC_SLURM_NO_APT   1: fail instead of installing missing packages
set -euo pipefail

dir=${LARTPC_SLURM_DIR:-/var/tmp/lartpc-slurm}
nodes=${LARTPC_SLURM_NODES:-1}
timeout=${LARTPC_SLURM_TIMEOUT:-60}
port=${LARTPC_SLURM_PORT:-6817}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=jobs/slurm/local/netns.sh
source "$here/netns.sh"

die() { echo "start.sh: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "needs root (slurmd runs jobs as their user; munged needs its key)"
[[ $nodes =~ ^[1-9][0-9]*$ ]] || die "LARTPC_SLURM_NODES=$nodes: expected a count >= 1"
if [[ ! $port =~ ^[0-9]+$ ]] || (( port < 1024 || port > 65534 )); then
    die "LARTPC_SLURM_PORT=$port: expected a port from 1024 to 65534"
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    [[ ${LARTPC_SLURM_NO_APT:-0} == 1 ]] && die "slurm-wlm or munge missing and LARTPC_SLURM_NO_APT=1"
    command -v apt-get >/dev/null || die "slurm-wlm missing and no apt-get to install it"
    echo "start.sh: installing slurm-wlm and munge with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    # Update the lists only when the candidate is unknown, to stay offline when we can.
    apt-cache show slurmd >/dev/null 2>&1 || apt-get update -q
    apt-get install -y -q --no-install-recommends slurm-wlm munge >&2 \
        || die "apt-get install slurm-wlm munge failed"
fi

host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
mkdir -p "$dir"/{ctld,spool,log,run}
conf=$dir/slurm.conf

# A start that fails half-way stops what it started: daemons, namespaces, links.
up=0
undo() { (( up )) || LARTPC_SLURM_DIR=$dir bash "$here/stop.sh" >/dev/null 2>&1 || true; }
trap undo EXIT
# Stop what a previous start left running, so the new config is the one in force.
for pidfile in "$dir"/run/slurmd*.pid "$dir"/run/slurmctld.pid; do
    if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        kill "$(cat "$pidfile")" && sleep 1
    fi
    rm -f "$pidfile"
done

if (( nodes == 1 )); then
    names=("$host")
    ctl="SlurmctldHost=$host"
    node_lines="NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN"
    spool=$dir/spool pidf=$dir/run/slurmd.pid logf=$dir/log/slurmd.log
else
    net_up "$nodes" "$dir"
    names=() node_lines=""
    for ((i = 1; i <= nodes; i++)); do
        names+=("$(node_name "$i")")
        mkdir -p "$dir/spool/$(node_name "$i")"
        # every node sees the host's cores: jobs on two nodes share them
        node_lines+="NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$cpus "
        node_lines+="RealMemory=$((mem_mb / nodes)) State=UNKNOWN"$'\n'
    done
    ctl="SlurmctldHost=$host($ctl_addr)"
    spool=$dir/spool/%n pidf=$dir/run/slurmd-%n.pid logf=$dir/log/slurmd-%n.log
fi

cat > "$conf.tmp" <<CONF
# Written by jobs/slurm/local/start.sh: $nodes node(s), no cgroups, no accounting.
ClusterName=lartpc-local
$ctl
SlurmUser=root
AuthType=auth/munge
# A requeued job waits cred_expire seconds before it may start again (default 120; 5 is
# the least slurm takes). It is also how long a job step's credential is good for from
# its creation to its launch: 10 s leaves room on a loaded 2-core test machine.
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# A requeued job whose wait (above) has passed starts at the next pass of the main
# scheduler that finds it: every 2 s here, not the default 60 (no event wakes it, and
# backfill skips its passes while nothing changed).
SchedulerParameters=sched_interval=2
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$pidf
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$logf
SlurmctldPort=$port
SlurmdPort=$((port + 1))
MinJobAge=600
InactiveLimit=0
KillWait=30
$node_lines
PartitionName=debug Nodes=$(IFS=,; echo "${names[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
mv "$conf.tmp" "$conf"
export SLURM_CONF=$conf

# munged: key made by the package; its socket folder may be missing in a container.
if ! pgrep -x munged >/dev/null; then
    [[ -s /etc/munge/munge.key ]] || mungekey --create >/dev/null 2>&1 \
        || /usr/sbin/create-munge-key -f >/dev/null 2>&1 || die "no /etc/munge/munge.key"
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    runuser -u munge -- /usr/sbin/munged || die "munged did not start"
fi
munge -n | unmunge >/dev/null || die "munge round trip failed (see /var/log/munge/munged.log)"

slurmctld -f "$conf" -c || die "slurmctld did not start (see $dir/log/slurmctld.log)"
if (( nodes == 1 )); then
    slurmd -f "$conf" || die "slurmd did not start (see $dir/log/slurmd.log)"
else
    for ((i = 1; i <= nodes; i++)); do
        node_exec "$i" "$dir" slurmd -f "$conf" -N "$(node_name "$i")" \
            || die "slurmd of $(node_name "$i") did not start (see $dir/log/)"
    done
fi

for name in "${names[@]}"; do
    state=
    for ((i = 0; i < timeout; i++)); do
        state=$(sinfo -h -n "$name" -o %t 2>/dev/null || true)
        case $state in
            idle*) break ;;
            down*|drain*) scontrol update NodeName="$name" State=RESUME 2>/dev/null || true ;;
        esac
        sleep 1
    done
    if [[ $state != idle* ]]; then
        tail -n 20 "$dir"/log/*.log >&2 || true
        die "node $name not idle after ${timeout}s (state: ${state:-none})"
    fi
done
up=1
echo "start.sh: SLURM up, node(s) ${names[*]} idle with $cpus CPUs each" >&2
echo "export SLURM_CONF=$conf"
