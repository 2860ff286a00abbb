# shellcheck shell=bash
# Sourced on the node before the launch (`lartpc sweep --site perlmutter`). Edit to
# match how lartpc is installed for you; the sweep copies this file into its jobs/
# folder, so each sweep keeps the prelude it ran with.
module load pytorch  # NERSC's PyTorch build (CUDA, NCCL); lartpc's venv sits on top
export SLURM_CPU_BIND=cores  # pin each task's threads to its own cores
# The ranks' other defaults (HDF5 file locking, OpenMP threads, NCCL) are in
# jobs/slurm/env.sh; export a different value here to change one.
