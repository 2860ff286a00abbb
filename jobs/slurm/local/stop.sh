#!/usr/bin/env bash
# Stop the one-node SLURM started by start.sh (slurmd, slurmctld; munged is left,
# other software may use it). Keeps the state folder for its logs.
#
# Usage: jobs/slurm/local/stop.sh
set -euo pipefail

dir=${LARTPC_SLURM_DIR:-/var/tmp/lartpc-slurm}
for name in slurmd slurmctld; do
    pidfile=$dir/run/$name.pid
    [[ -s $pidfile ]] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    fi
    rm -f "$pidfile"
done
echo "stop.sh: SLURM stopped (logs in $dir/log)" >&2
