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
#   NCCL_DEBUG=WARN               NCCL's warnings in the job log, not INFO's flood
#   LARTPC_SRUN_MPI=pmix          srun's --mpi plugin for Horovod over MPI
#                                 (horovod-srun.sbatch); `srun --mpi=list` shows the site's

# lartpc_env RANK_CORES: export the defaults above.
lartpc_env() {
    export HDF5_USE_FILE_LOCKING="${HDF5_USE_FILE_LOCKING:-FALSE}"
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$1}"
    export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
    export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
    export LARTPC_SRUN_MPI="${LARTPC_SRUN_MPI:-pmix}"
}
