#!/usr/bin/env bash
# Stop the SLURM started by start.sh (every slurmd, slurmctld; munged is left, other
# software may use it), and remove the namespaces and links of a multi-node start.
# Keeps the state folder for its logs.
#
# Usage: jobs/slurm/local/stop.sh
set -euo pipefail

dir=${LARTPC_SLURM_DIR:-/var/tmp/lartpc-slurm}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=jobs/slurm/local/netns.sh
source "$here/netns.sh"
for pidfile in "$dir"/run/slurmd*.pid "$dir"/run/slurmctld.pid; do
    [[ -s $pidfile ]] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    fi
    rm -f "$pidfile"
done
net_down  # the namespaces, veths and bridge of a multi-node start, if any
echo "stop.sh: SLURM stopped (logs in $dir/log)" >&2
