# shellcheck shell=bash
# Shared by every job script in jobs/slurm and jobs/lsf: read the point's settings,
# compute the training time limit from the job's remaining wall time, launch, and
# requeue (SLURM) or resubmit (LSF) a run that stopped at its time limit, so the next
# job resumes from the run folder's checkpoint.
#
# Settings, from the environment (`lartpc sweep` writes them into each script):
#   LARTPC_CONFIG   preset or TOML file for `lartpc train --config` (required)
#   LARTPC_DATA     event folder (required)
#   LARTPC_RUN      run folder; resumed when it holds checkpoint.pt (required)
#   LARTPC_SET      extra `section.key=value` overrides, separated by spaces
#   LARTPC_TIME     requested wall time (SLURM syntax, e.g. 04:00:00); fallback when the
#                   scheduler cannot tell the time left
#   LARTPC_TIME_MARGIN_S  seconds kept free at the end of the job (default 300: more
#                   than LARTPC_WARNING_LEAD_S below plus a checkpoint's time)
#   LARTPC_TIME_LIMIT_S   train.time_limit_s to use instead of the computed one
#   LARTPC_MAX_REQUEUES   most requeues or resubmissions of one run (default 20;
#                   `lartpc sweep --max-requeues`). A run that has spent its study
#                   budget (train.budget_s; run.json's budget_spent) is never requeued.
#   LARTPC_NTASKS, LARTPC_NNODES, LARTPC_TASKS_PER_NODE, LARTPC_GPUS_PER_TASK
#                   shape of the job; the scheduler's own variables win when set
#   LARTPC_CORES_PER_TASK  CPU cores per rank (SLURM_CPUS_PER_TASK wins when set)
#   LARTPC_RANKS_PER_TASK  ranks one srun task starts (torchrun: the node's ranks)
#   LARTPC_PRELUDE  shell file sourced before anything else (module load, conda, ...)
#   LARTPC_VENV     virtual environment to activate on the compute node
#   LARTPC_JOBS_DIR the jobs/ folder holding this file (default <submit dir>/jobs)
#   LARTPC_GLOO_IFACE  network interface for Gloo across nodes (horovod-gloo.sbatch)
#   LARTPC_NCCL_LOG_DIR  folder for NCCL's set-up logs (default <run's parent>/logs; env.sh)
#   LARTPC_NETWORK_OUT  cluster profile allreduce.sbatch writes (required there)
#   LARTPC_ALLREDUCE_ARGS  more `lartpc bench allreduce` options (allreduce.sbatch)
#   LARTPC_SCRIPT   this script's path (LSF resubmits it)
#   LARTPC_MANIFEST, LARTPC_POINT  the sweep's manifest.json and this point's name: an
#                   LSF resubmission's job id is recorded there
#   LARTPC_DRY_RUN  1: print the launch command and exit without running anything
# The ranks' environment (HDF5 file locking, OpenMP threads, NCCL, torchrun's shutdown
# time) is set in env.sh.
#
# Exit status of a job script: 0 when the run completed, spent its study budget, or was
# requeued/resubmitted to go on; 2 when training refused to run (bad input, a refused
# resume) or the job's settings are wrong; 3 (LARTPC_EXIT_NOT_RESUMED) when the run
# stopped unfinished and nothing will resume it (requeue limit reached, the requeue or
# resubmission failed or was refused, or no scheduler to requeue it: a script run by
# hand, to be run again): the job ends FAILED, so `afterok` dependents do
# not start on an unfinished run; any other: the launcher's failure.

# SLURM's warning before the wall time, in seconds: `#SBATCH --signal=B:USR1@120` in the
# templates and jobs/sweep.py's WARNING_LEAD_S say the same (tests/test_jobs.py checks).
# LARTPC_TIME_MARGIN_S (300) must exceed it plus a checkpoint's time, so that training
# normally stops by its own limit before the warning comes.
LARTPC_WARNING_LEAD_S=120
LARTPC_EXIT_NOT_RESUMED=3

# shellcheck source=jobs/slurm/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

lartpc_log() { echo "[lartpc-job $(date +%H:%M:%S)] $*" >&2; }
lartpc_die() { lartpc_log "error: $*"; exit 2; }

# lartpc_seconds TIME: a SLURM time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in seconds;
# prints nothing for UNLIMITED and other non-times.
lartpc_seconds() {
    local t=$1 d=0 h=0 m=0 s=0
    local -a p
    if [[ $t == *-* ]]; then
        d=${t%%-*}
        IFS=: read -ra p <<< "${t#*-}"
        h=${p[0]:-0} m=${p[1]:-0} s=${p[2]:-0}
    else
        IFS=: read -ra p <<< "$t"
        case ${#p[@]} in
            1) m=${p[0]} ;;
            2) m=${p[0]} s=${p[1]} ;;
            3) h=${p[0]} m=${p[1]} s=${p[2]} ;;
            *) return 0 ;;
        esac
    fi
    local x
    for x in "$d" "$h" "$m" "$s"; do [[ $x =~ ^[0-9]+$ ]] || return 0; done
    echo $(( ((10#$d * 24 + 10#$h) * 60 + 10#$m) * 60 + 10#$s ))
}

# lartpc_remaining_s: seconds of wall time this job has left, or nothing if unknown.
lartpc_remaining_s() {
    local left=""
    if [[ -n ${SLURM_JOB_ID:-} ]] && command -v squeue >/dev/null; then
        left=$(lartpc_seconds "$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null)")
    elif [[ -n ${LSB_JOBID:-} ]] && command -v bjobs >/dev/null; then
        # "H:MM L" (hours:minutes, L = from the run limit)
        local hm
        hm=$(bjobs -noheader -o time_left "$LSB_JOBID" 2>/dev/null | awk '{print $1}')
        [[ $hm =~ ^([0-9]+):([0-9]+)$ ]] \
            && left=$(( (10#${BASH_REMATCH[1]} * 60 + 10#${BASH_REMATCH[2]}) * 60 ))
    fi
    if [[ -z $left && -n ${LARTPC_TIME:-} ]]; then
        left=$(lartpc_seconds "$LARTPC_TIME")
        # the time this script has run already; not in a dry run (the preview of a job
        # that has not started: the same line however long the preview took)
        [[ -n $left && ${LARTPC_DRY_RUN:-0} != 1 ]] && left=$(( left - SECONDS ))
    fi
    echo "$left"
}

# lartpc_time_limit_s: train.time_limit_s for this job (remaining wall time minus the
# margin, at least 60 s), or nothing to keep the config's own limit.
lartpc_time_limit_s() {
    if [[ -n ${LARTPC_TIME_LIMIT_S:-} ]]; then echo "$LARTPC_TIME_LIMIT_S"; return; fi
    local left
    left=$(lartpc_remaining_s)
    [[ -n $left ]] || return 0
    left=$(( left - ${LARTPC_TIME_MARGIN_S:-300} ))
    echo $(( left < 60 ? 60 : left ))
}

# lartpc_prepare: source the prelude, set the ranks' environment (env.sh), activate
# the environment and check lartpc is there.
lartpc_prepare() {
    lartpc_note_script
    if [[ -n ${LARTPC_PRELUDE:-} && ${LARTPC_DRY_RUN:-0} != 1 ]]; then
        [[ -r $LARTPC_PRELUDE ]] || lartpc_die "prelude $LARTPC_PRELUDE not readable"
        lartpc_log "prelude: $LARTPC_PRELUDE"
        # Site scripts (module, conda) often read unset variables: not under `set -u`.
        set +u
        # shellcheck source=/dev/null
        source "$LARTPC_PRELUDE" || lartpc_die "prelude $LARTPC_PRELUDE failed"
        set -u
    fi
    lartpc_env "$(lartpc_cores)"
    if [[ -n ${LARTPC_VENV:-} && ${LARTPC_DRY_RUN:-0} != 1 ]]; then
        # shellcheck source=/dev/null
        source "$LARTPC_VENV/bin/activate"
    fi
    if [[ ${LARTPC_DRY_RUN:-0} != 1 ]]; then
        command -v lartpc >/dev/null || lartpc_die "lartpc not on PATH (set LARTPC_VENV)"
    fi
    return 0
}

# lartpc_setup BACKEND: check the settings, prepare (lartpc_prepare) and fill
# LARTPC_TRAIN_ARGS with the `lartpc train ...` arguments (without "lartpc").
lartpc_setup() {
    : "${LARTPC_CONFIG:?set LARTPC_CONFIG (preset or TOML file)}"
    : "${LARTPC_DATA:?set LARTPC_DATA (event folder)}"
    : "${LARTPC_RUN:?set LARTPC_RUN (run folder)}"
    lartpc_prepare
    LARTPC_TRAIN_ARGS=(train --config "$LARTPC_CONFIG" --data "$LARTPC_DATA" --out "$LARTPC_RUN"
                       --set "dist.backend=$1")
    local -a extra
    read -ra extra <<< "${LARTPC_SET:-}"
    local kv user=""
    for kv in "${extra[@]}"; do
        # the user's time limit is kept aside: the segment's is the smaller of it and
        # the job's (below)
        if [[ $kv == train.time_limit_s=* ]]; then user=${kv#*=}; continue; fi
        LARTPC_TRAIN_ARGS+=(--set "$kv")
    done
    local limit
    limit=$(lartpc_smaller_limit "$user" "$(lartpc_time_limit_s)")
    # Last, so it wins over the preset: the job's wall time is a hard bound a preset
    # cannot know. Counted from now, not from each rank's start: the launch (srun,
    # torchrun, interpreters on a shared file system) is inside it (lartpc.commands.train).
    if [[ -n $limit ]]; then
        LARTPC_TRAIN_ARGS+=(--set "train.time_limit_s=$limit")
        LARTPC_LIMIT_FROM=$(date +%s)
        export LARTPC_LIMIT_FROM
    else
        unset LARTPC_LIMIT_FROM  # another job's, had it been handed on: not this one's
    fi
    return 0
}

# lartpc_smaller_limit USER JOB: the smaller of two time limits in seconds, either of
# which may be empty (no limit); a USER value that is no plain number (inf, a typo) is
# passed on when JOB is empty, for `lartpc train` to judge, and otherwise yields JOB.
lartpc_smaller_limit() {
    local user=$1 job=$2
    if [[ -z $user ]]; then echo "$job"; return; fi
    if [[ -z $job ]]; then echo "$user"; return; fi
    if [[ $user =~ ^[0-9]+([.][0-9]*)?$ ]]; then
        awk -v a="$user" -v b="$job" 'BEGIN { print (a + 0 < b + 0) ? a : b }'
    else
        echo "$job"
    fi
}

lartpc_ntasks() { echo "${SLURM_NTASKS:-${LARTPC_NTASKS:-1}}"; }
lartpc_nnodes() { echo "${SLURM_NNODES:-${LARTPC_NNODES:-1}}"; }
# lartpc_cores: CPU cores per rank (an srun task of torchrun holds the node's ranks).
lartpc_cores() {
    local c
    if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
        c=$(( SLURM_CPUS_PER_TASK / ${LARTPC_RANKS_PER_TASK:-1} ))
    else
        c=${LARTPC_CORES_PER_TASK:-1}
    fi
    echo $(( c < 1 ? 1 : c ))
}
lartpc_gpus() { echo "${LARTPC_GPUS_PER_TASK:-1}"; }

# lartpc_hosts: one node name per line (placeholders node1.. outside a SLURM job).
lartpc_hosts() {
    if [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
        scontrol show hostnames "$SLURM_JOB_NODELIST"
    else
        local i
        for ((i = 1; i <= $(lartpc_nnodes); i++)); do echo "node$i"; done
    fi
}

# lartpc_host_slots: "host1:n1,host2:n2" for horovodrun -H, from SLURM's tasks per node.
# Dies when there are no node names (scontrol failed): call it on a line of its own
# (`slots=$(lartpc_host_slots) || exit 2`), since a die inside "$(...)" in a command's
# arguments would not stop the script.
lartpc_host_slots() {
    local -a hosts counts parts
    mapfile -t hosts < <(lartpc_hosts)
    (( ${#hosts[@]} > 0 )) \
        || lartpc_die "no node names from SLURM_JOB_NODELIST=${SLURM_JOB_NODELIST:-} (scontrol show hostnames failed?)"
    if [[ -n ${SLURM_TASKS_PER_NODE:-} ]]; then
        IFS=, read -ra parts <<< "$SLURM_TASKS_PER_NODE"  # e.g. 4(x2),2
        local p i
        for p in "${parts[@]}"; do
            if [[ $p =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
                for ((i = 0; i < BASH_REMATCH[2]; i++)); do counts+=("${BASH_REMATCH[1]}"); done
            else
                counts+=("$p")
            fi
        done
    else
        local left per=${LARTPC_TASKS_PER_NODE:-1}
        left=$(lartpc_ntasks)
        while (( left > 0 )); do counts+=($(( left < per ? left : per ))); left=$(( left - per )); done
    fi
    local out="" j
    for ((j = 0; j < ${#hosts[@]}; j++)); do out+="${out:+,}${hosts[j]}:${counts[j]:-1}"; done
    echo "$out"
}

# lartpc_lsf_host_slots: "host1:n1,host2:n2" for horovodrun -H, from LSF's
# LSB_MCPU_HOSTS ("host1 n1 host2 n2 ..."): horovodrun would otherwise ask IBM CSM for the
# hosts whenever LSB_JOBID is set, and fail where there is no CSM. Outside an LSF job, in
# a dry run, placeholders node1.. as lartpc_host_slots gives. Dies when the variable is
# missing or is not host/count pairs. Call it on a line of its own
# (`slots=$(lartpc_lsf_host_slots) || exit 2`): a die inside "$(...)" in a command's
# arguments would not stop the script.
lartpc_lsf_host_slots() {
    if [[ -z ${LSB_MCPU_HOSTS:-} ]]; then
        if [[ -z ${LSB_JOBID:-} && ${LARTPC_DRY_RUN:-0} == 1 ]]; then
            lartpc_host_slots
            return
        fi
        lartpc_die "LSB_MCPU_HOSTS is not set: no hosts for horovodrun -H (not inside an LSF job?)"
    fi
    local -a words
    read -ra words <<< "$LSB_MCPU_HOSTS"
    local out="" j
    (( ${#words[@]} > 0 && ${#words[@]} % 2 == 0 )) \
        || lartpc_die "LSB_MCPU_HOSTS='$LSB_MCPU_HOSTS': expected pairs of host and slot count"
    for ((j = 0; j < ${#words[@]}; j += 2)); do
        [[ ${words[j + 1]} =~ ^[1-9][0-9]*$ && ${words[j]} != *[:,]* ]] \
            || lartpc_die "LSB_MCPU_HOSTS='$LSB_MCPU_HOSTS': expected pairs of host and slot count"
        out+="${out:+,}${words[j]}:${words[j + 1]}"
    done
    echo "$out"
}

# lartpc_master: export MASTER_ADDR (first node) and MASTER_PORT (per job, so two jobs
# sharing a node do not collide) for torch.distributed.
lartpc_master() {
    local -a hosts
    mapfile -t hosts < <(lartpc_hosts)
    (( ${#hosts[@]} > 0 )) || lartpc_die "no node names from $SLURM_JOB_NODELIST"
    MASTER_ADDR=${hosts[0]}
    MASTER_PORT=$(lartpc_job_port)
    export MASTER_ADDR MASTER_PORT
}

# lartpc_job_port: this job's rendezvous port, 10000-29999: below Linux's ephemeral
# ports (32768-60999), which a busy node's connections may hold; as
# lartpc.dist.world.job_port.
lartpc_job_port() { echo $(( 10000 + ${SLURM_JOB_ID:-${LSB_JOBID:-0}} % 20000 )); }

# lartpc_run_field RUN FIELD: a top-level field of RUN/run.json (JSON's spelling:
# true/false), or nothing.
lartpc_run_field() {
    [[ -s $1/run.json ]] || return 0
    python3 -c 'import json, sys; v = json.load(open(sys.argv[1])).get(sys.argv[2], "")
print(json.dumps(v) if isinstance(v, bool) else v)' "$1/run.json" "$2" 2>/dev/null || true
}

# lartpc_run_status RUN: the "status" field of RUN/run.json, or nothing.
lartpc_run_status() { lartpc_run_field "$1" status; }

lartpc_on_signal() {
    # Training stops by its own time limit, before this signal; if it is still running
    # the job is about to be killed, so ask every rank to stop now: each saves a
    # checkpoint at the step it is on and ends "preempted", and the job is requeued.
    lartpc_log "wall-time signal while training still runs: stopping it"
    LARTPC_SIGNALLED=1
    [[ -n ${LARTPC_CHILD:-} ]] || return 0
    if [[ ${LARTPC_RANKS_IN_STEPS:-0} == 1 ]]; then
        # The ranks run in the job's steps, under srun, which answers SIGTERM by
        # SIGKILLing its tasks: no rank could save. So the ranks are sent TERM
        # themselves (scancel without --batch signals the steps' processes, not this
        # shell), and srun ends when they have. A torchrun in a step gets the TERM too and
        # passes it on, then SIGKILLs its ranks after TORCH_ELASTIC_SHUTDOWN_TIMEOUT
        # (env.sh: 100 s, not torch's 30), so a slow checkpoint is not cut short.
        scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null \
            || lartpc_log "scancel --signal=TERM $SLURM_JOB_ID failed: the ranks were not told to stop"
    else
        # A launcher here (horovodrun, torchrun) would pass TERM on and SIGKILL its ranks
        # soon after (horovodrun 5 s, torchrun 30 s), before a slow step ends and saves.
        # So the ranks are sent TERM themselves, and the launcher ends when they have.
        local -a rank_pids
        read -ra rank_pids <<< "$(lartpc_rank_pids "$LARTPC_CHILD")"
        if (( ${#rank_pids[@]} )); then
            lartpc_log "TERM to the ranks themselves (pids ${rank_pids[*]}), not to the launcher"
            kill -TERM "${rank_pids[@]}" 2>/dev/null
        else  # the launcher is the rank, or no rank has started yet
            kill -TERM "$LARTPC_CHILD" 2>/dev/null
        fi
    fi
    return 0
}

# lartpc_rank_pids PID: the `lartpc train` processes (the ranks) among PID's descendants,
# read from /proc; not the shells a launcher runs them under (their command line holds
# "lartpc train" inside one word).
lartpc_rank_pids() {
    python3 - "$1" 2>/dev/null <<'PY' || true
import os, sys
kids = {}
for d in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{d}/stat") as f:
            kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(d)
    except (OSError, ValueError, IndexError):
        pass
todo, ranks = list(kids.get(int(sys.argv[1]), [])), []
while todo:
    pid = todo.pop()
    todo += kids.get(int(pid), [])
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        continue
    if any(os.path.basename(a) == b"lartpc" and b == b"train" for a, b in zip(argv, argv[1:])):
        ranks.append(pid)
print(" ".join(ranks))
PY
}

# lartpc_ranks_in_steps CMD...: whether the launcher CMD starts the ranks in job steps
# of their own (srun; the Horovod launcher that calls srun), not as its children here.
lartpc_ranks_in_steps() {
    [[ -n ${SLURM_JOB_ID:-} ]] || return 1
    [[ $(basename "$1") == srun || " $* " == *" lartpc.dist.srun_horovod "* ]]
}

# lartpc_quote CMD...: CMD as one line a shell reads back as the same words: plain words
# as they are (readable), anything else shell-quoted. The dry run's launch line.
lartpc_quote() {
    local arg line=""
    for arg in "$@"; do
        if [[ $arg =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then line+=" $arg"
        else printf -v arg '%q' "$arg"; line+=" $arg"; fi
    done
    echo "${line# }"
}

# lartpc_launch CMD...: run the launcher (or print it under LARTPC_DRY_RUN=1), then
# requeue when the run stopped at its time limit. Exits with the job's status.
lartpc_launch() {
    if [[ ${LARTPC_DRY_RUN:-0} == 1 ]]; then
        lartpc_quote "$@"
        exit 0
    fi
    mkdir -p "$(dirname "$LARTPC_RUN")"
    # NCCL writes its set-up lines there but makes no folder (env.sh)
    [[ -n ${NCCL_DEBUG_FILE:-} ]] && mkdir -p "$(dirname "$NCCL_DEBUG_FILE")"
    lartpc_log "run $LARTPC_RUN (status before: $(lartpc_run_status "$LARTPC_RUN"))"
    lartpc_log "launch: $*"
    # A rank that exits 2 (refused, bad input) writes 2 here (lartpc.cli): torchrun
    # reports any failed rank as exit 1, which alone would requeue a refusal. Beside
    # the run folder, which every node sees.
    LARTPC_EXIT_FILE="$(dirname "$LARTPC_RUN")/.$(basename "$LARTPC_RUN").exit-${SLURM_JOB_ID:-${LSB_JOBID:-$$}}"
    export LARTPC_EXIT_FILE
    rm -f "$LARTPC_EXIT_FILE"
    LARTPC_SIGNALLED=0
    LARTPC_RANKS_IN_STEPS=0
    if lartpc_ranks_in_steps "$@"; then LARTPC_RANKS_IN_STEPS=1; fi
    trap lartpc_on_signal USR1 USR2 TERM
    # In the background, so the trap runs while the launcher is still going.
    "$@" &
    LARTPC_CHILD=$!
    local rc
    while :; do
        rc=0
        wait "$LARTPC_CHILD" || rc=$?
        (( rc > 128 )) && kill -0 "$LARTPC_CHILD" 2>/dev/null && continue
        break
    done
    # A wait cut short by the trap returns 128 + the signal, also when the launcher
    # ended in between: its own status is kept by the shell, so ask again.
    if (( rc > 128 )); then rc=0; wait "$LARTPC_CHILD" || rc=$?; fi
    # From here on a signal must not kill this shell before it requeues (the default
    # action would): noted, and the decision below is made as it would be anyway.
    trap 'LARTPC_SIGNALLED=1' USR1 USR2 TERM
    if (( rc != 0 && rc != 2 )) && [[ $(cat "$LARTPC_EXIT_FILE" 2>/dev/null) == 2 ]]; then
        lartpc_log "launcher exit code $rc, but a rank exited 2"
        rc=2
    fi
    rm -f "$LARTPC_EXIT_FILE"
    local status
    status=$(lartpc_run_status "$LARTPC_RUN")
    lartpc_log "launcher exit code $rc, run status: ${status:-none}"
    # The exit code decides first: a status is only this segment's when training ended
    # cleanly. A refused resume (exit 2) leaves the previous segment's status (often
    # "preempted") in run.json, and requeueing on it would loop until the requeue limit.
    if (( rc == 0 )) && [[ $status == completed ]]; then
        exit 0
    fi
    if (( rc == 0 )) && [[ $(lartpc_run_field "$LARTPC_RUN" budget_spent) == true ]]; then
        lartpc_log "study budget spent ($(lartpc_run_field "$LARTPC_RUN" train_time_s) s of" \
                   "training, train.budget_s=$(lartpc_run_field "$LARTPC_RUN" budget_s)); not requeued"
        exit 0
    fi
    if (( rc == 0 )) && [[ $status == time_limit || $status == preempted ]]; then
        lartpc_requeue || exit "$LARTPC_EXIT_NOT_RESUMED"
        exit 0
    fi
    # A refused resume is refused again after a requeue: never requeue it, even when the
    # scheduler's signal came while it ran.
    if (( rc == 2 )); then
        lartpc_log "training refused to run or failed on its input (exit 2, the error is above); not requeued"
        exit 2
    fi
    if [[ $LARTPC_SIGNALLED == 1 && -e $LARTPC_RUN/checkpoint.pt ]]; then
        lartpc_requeue || exit "$LARTPC_EXIT_NOT_RESUMED"
        exit 0
    fi
    (( rc != 0 )) || rc=1
    lartpc_log "run failed (exit $rc, run status ${status:-none}); not requeued"
    exit "$rc"
}

# An LSF chain resubmits $LARTPC_SCRIPT as it is on disk then (SLURM requeues the text it
# was given). Its first job notes the script's hash; a later one hands it on with the
# rest of its environment, so a chain whose script has since changed (a new sweep into
# the same folder, other settings) stops instead of going on with the new one.
lartpc_note_script() {
    if [[ -n ${LSB_JOBID:-} && -n ${LARTPC_SCRIPT:-} && -z ${LARTPC_SCRIPT_SHA256:-} ]]; then
        LARTPC_SCRIPT_SHA256=$(lartpc_sha256 "$LARTPC_SCRIPT")
        export LARTPC_SCRIPT_SHA256
    fi
    return 0
}

lartpc_sha256() {
    local sum
    sum=$(sha256sum < "$1" 2>/dev/null) || { echo unreadable; return 0; }
    echo "${sum%% *}"
}

# lartpc_requeue: requeue (SLURM) or resubmit (LSF) this job so the run goes on. Returns
# 0 when it did, and 1 when it gave up or failed (the reason is logged): the run is left
# unfinished, and lartpc_launch then exits LARTPC_EXIT_NOT_RESUMED.
lartpc_requeue() {
    local max=${LARTPC_MAX_REQUEUES:-20}
    if [[ -n ${SLURM_JOB_ID:-} ]]; then
        local n=${SLURM_RESTART_COUNT:-0}
        if (( n >= max )); then
            lartpc_log "requeued $n times already (LARTPC_MAX_REQUEUES=$max); giving up: the run is unfinished"
            return 1
        fi
        lartpc_log "time limit reached; requeueing job $SLURM_JOB_ID (restart $((n + 1)))"
        if ! scontrol requeue "$SLURM_JOB_ID"; then
            lartpc_log "scontrol requeue $SLURM_JOB_ID failed: resubmit the script to resume"
            return 1
        fi
    elif [[ -n ${LSB_JOBID:-} ]]; then
        local n=${LARTPC_RESUBMIT_COUNT:-0}
        if (( n >= max )); then
            lartpc_log "resubmitted $n times already (LARTPC_MAX_REQUEUES=$max); giving up: the run is unfinished"
            return 1
        fi
        [[ -n ${LARTPC_SCRIPT:-} ]] || { lartpc_log "LARTPC_SCRIPT unset: cannot resubmit"; return 1; }
        if [[ -n ${LARTPC_SCRIPT_SHA256:-} && $(lartpc_sha256 "$LARTPC_SCRIPT") != "$LARTPC_SCRIPT_SHA256" ]]; then
            lartpc_log "$LARTPC_SCRIPT is not the script this chain started with (rewritten since, by another sweep into its folder?): not resubmitted; submit it again to resume with it"
            return 1
        fi
        lartpc_log "time limit reached; resubmitting $LARTPC_SCRIPT (resubmission $((n + 1)))"
        local out re='Job <([0-9]+)>'
        # Without what this job worked out for itself (lartpc_env's defaults, the time
        # limit's origin): bsub hands the next job this shell's environment.
        local -a unset=(-u LARTPC_LIMIT_FROM) name
        for name in ${LARTPC_ENV_DEFAULTED:-}; do unset+=(-u "$name"); done
        if ! out=$(env "${unset[@]}" LARTPC_RESUBMIT_COUNT=$((n + 1)) bsub < "$LARTPC_SCRIPT" 2>&1); then
            lartpc_log "bsub failed: $out"; return 1
        fi
        lartpc_log "$out"
        # The new job id goes into the sweep's manifest, so `lartpc sweep --submit` sees
        # the chain's live job and does not start a second one.
        if [[ $out =~ $re && -n ${LARTPC_MANIFEST:-} && -n ${LARTPC_POINT:-} ]]; then
            python3 -m lartpc.jobs.submit "$LARTPC_MANIFEST" "$LARTPC_POINT" "${BASH_REMATCH[1]}" \
                || lartpc_log "job ${BASH_REMATCH[1]} not recorded in $LARTPC_MANIFEST"
        fi
    else
        lartpc_log "time limit reached outside a scheduler: run again to resume"
        return 1
    fi
    return 0
}
