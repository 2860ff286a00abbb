# shellcheck shell=bash
# The environment every rank starts with, in one place (sourced by common.sh). Each
# setting is a default: a value already in the job's environment wins, whether it was
# exported before `sbatch`/`bsub` or set by the sweep's `--prelude`.
#
#   HDF5_USE_FILE_LOCKING=FALSE   the event shards are only ever read; HDF5's file locks
#                                 fail or serialise on Lustre, GPFS and NFS project folders
#   OMP_NUM_THREADS=<rank cores>  OpenMP threads of numpy, blosc and other native code
#                                 (lartpc sets torch's own threads from the rank's CPU mask)
#   TORCH_NCCL_ASYNC_ERROR_HANDLING=1
#                                 a rank that dies aborts the others' NCCL collectives
#                                 instead of leaving them waiting until the timeout
#   NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET, NCCL_DEBUG_FILE=<logs>/nccl-<run>-<job>.%h.%p.log
#                                 NCCL's set-up lines (version, plugin, the transport it
#                                 chose: NET/IB, NET/Socket, NET/OFI...), written once per
#                                 rank to a file beside the scheduler's log, not the job
#                                 log; lartpc reads its own after set-up into run.json's
#                                 `network` (LARTPC_NCCL_LOG_DIR: another folder). A
#                                 NCCL_DEBUG of your own (WARN...) keeps NCCL's output as
#                                 you set it, and the transport is then unknown.
#   LARTPC_SRUN_MPI=pmix          srun's --mpi plugin for Horovod over MPI
#                                 (horovod-srun.sbatch); `srun --mpi=list` shows the site's;
#                                 a site file's srun_mpi is exported by the sweep
#   TORCH_ELASTIC_SHUTDOWN_TIMEOUT=100
#                                 seconds torchrun gives its ranks to end after it passes
#                                 on a TERM, before it SIGKILLs them (torch's default 30 s
#                                 would cut a slow checkpoint short at the wall-time
#                                 warning): the warning's lead (LARTPC_WARNING_LEAD_S, 120)
#                                 less 20 s for the script to requeue. Read by torchrun's
#                                 LaunchConfig (torch/distributed/launcher/api.py, torch
#                                 2.13); a torchrun without it keeps 30 s

# lartpc_env RANK_CORES: export the defaults above. The names of those this job had not
# set go into LARTPC_ENV_DEFAULTED, so a job that resubmits itself (LSF's bsub copies the
# submitting shell's environment) can leave them out and the next job works its own out
# (its job id in NCCL's log name, its cores).
lartpc_env() {
    local name
    LARTPC_ENV_DEFAULTED=""
    for name in HDF5_USE_FILE_LOCKING OMP_NUM_THREADS TORCH_NCCL_ASYNC_ERROR_HANDLING \
                NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE LARTPC_SRUN_MPI \
                TORCH_ELASTIC_SHUTDOWN_TIMEOUT; do
        [[ -n ${!name+set} ]] || LARTPC_ENV_DEFAULTED+=" $name"
    done
    export HDF5_USE_FILE_LOCKING="${HDF5_USE_FILE_LOCKING:-FALSE}"
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$1}"
    export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
    if [[ -z ${NCCL_DEBUG:-} && -n ${LARTPC_RUN:-} ]]; then
        local dir=${LARTPC_NCCL_LOG_DIR:-$(dirname "$LARTPC_RUN")/logs}
        export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS="${NCCL_DEBUG_SUBSYS:-INIT,NET}"
        export NCCL_DEBUG_FILE="${NCCL_DEBUG_FILE:-$dir/nccl-$(basename "$LARTPC_RUN")-${SLURM_JOB_ID:-${LSB_JOBID:-$$}}.%h.%p.log}"
    fi
    export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
    export LARTPC_SRUN_MPI="${LARTPC_SRUN_MPI:-pmix}"
    export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-$(( ${LARTPC_WARNING_LEAD_S:-120} - 20 ))}"
}
