#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine, for tests and trying the job scripts.
#
# Installs Debian's slurm-wlm and munge with apt-get when missing, writes a minimal
# slurm.conf into a state folder (never /etc/slurm, so a real cluster's config is left
# alone), starts munged, slurmctld and slurmd, and waits until the node is idle.
# Needs root: slurmd runs jobs as their submitting user and munged needs its key.
#
# Usage: jobs/slurm/local/start.sh
#   Then: export SLURM_CONF=$LARTPC_SLURM_DIR/slurm.conf   (printed on the last line)
# Environment:
#   LARTPC_SLURM_DIR      state, logs and slurm.conf (default /var/tmp/lartpc-slurm)
#   LARTPC_SLURM_TIMEOUT  seconds to wait for the node to become idle (default 60)
#   LARTPC_SLURM_NO_APT   1: fail instead of installing missing packages
set -euo pipefail

dir=${LARTPC_SLURM_DIR:-/var/tmp/lartpc-slurm}
timeout=${LARTPC_SLURM_TIMEOUT:-60}

die() { echo "start.sh: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "needs root (slurmd runs jobs as their user; munged needs its key)"

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

# Stop what a previous start left running, so the new config is the one in force.
for pidfile in "$dir"/run/slurmd.pid "$dir"/run/slurmctld.pid; do
    if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        kill "$(cat "$pidfile")" && sleep 1
    fi
done

cat > "$conf.tmp" <<CONF
# Written by jobs/slurm/local/start.sh: one node, no cgroups, no accounting.
ClusterName=lartpc-local
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
# A requeued job waits cred_expire seconds before it may start again (default 120).
AuthInfo=cred_expire=30
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
MinJobAge=600
InactiveLimit=0
KillWait=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
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
slurmd -f "$conf" || die "slurmd did not start (see $dir/log/slurmd.log)"

state=
for ((i = 0; i < timeout; i++)); do
    state=$(sinfo -h -n "$host" -o %t 2>/dev/null || true)
    case $state in
        idle*) break ;;
        down*|drain*) scontrol update NodeName="$host" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 1
done
if [[ $state != idle* ]]; then
    tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    die "node $host not idle after ${timeout}s (state: ${state:-none})"
fi
echo "start.sh: SLURM up, node $host idle with $cpus CPUs" >&2
echo "export SLURM_CONF=$conf"
