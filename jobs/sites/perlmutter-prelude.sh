# shellcheck shell=bash
# Sourced on the node before the launch (`lartpc sweep --site perlmutter`). Edit to
# match how lartpc is installed for you; the sweep copies this file into its jobs/
# folder, so each sweep keeps the prelude it ran with.
module load pytorch  # NERSC's PyTorch build (CUDA, NCCL and its libfabric plugin)
export SLURM_CPU_BIND=cores  # pin each task's threads to its own cores
# NCCL over Slingshot-11 through the aws-ofi-nccl (libfabric, cxi) plugin, with the
# settings NERSC's documentation gives for it; check it for the values of the day.
# run.json's `network` then records the transport NCCL chose: NET/OFI or Libfabric,
# not NET/Socket (a run over sockets is warned about in the job log).
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-hsn}"
export NCCL_NET_GDR_LEVEL="${NCCL_NET_GDR_LEVEL:-PHB}"
export NCCL_CROSS_NIC="${NCCL_CROSS_NIC:-1}"
export FI_CXI_DISABLE_HOST_REGISTER="${FI_CXI_DISABLE_HOST_REGISTER:-1}"
export FI_MR_CACHE_MONITOR="${FI_MR_CACHE_MONITOR:-userfaultfd}"
# The ranks' other defaults (HDF5 file locking, OpenMP threads, NCCL's log) are in
# jobs/slurm/env.sh; export a different value here to change one.
