#!/usr/bin/env bash
# Build and install Horovod 0.28.1 into the given Python environment.
#
# Horovod's last release compiles its PyTorch extension as C++14, but
# PyTorch >= 2.1 headers need C++17. We build from the sdist with the standard
# raised to 17 in its two CMakeLists and cache the wheel, keyed by Horovod,
# torch, Python and the build features, so a reinstall takes seconds.
#
# Usage: jobs/env/install_horovod.sh [PYTHON]
# Environment:
#   LARTPC_WHEEL_CACHE  wheel cache folder (default ~/.cache/lartpc/wheels)
#   HOROVOD_VERSION     (default 0.28.1)
#   LARTPC_HOROVOD_MPI  1/0 to force MPI support on/off (default: on when mpicxx exists)
#   LARTPC_HOROVOD_NCCL 1/0 to force NCCL GPU operations (default: on when torch has CUDA and nvcc exists)
set -euo pipefail

PYTHON=${1:-python}
HVD=${HOROVOD_VERSION:-0.28.1}
CACHE=${LARTPC_WHEEL_CACHE:-$HOME/.cache/lartpc/wheels}

torch_version=$("$PYTHON" -c 'import torch; print(torch.__version__)')
torch_cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")')
py_tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

with_mpi=${LARTPC_HOROVOD_MPI:-}
if [[ -z "$with_mpi" ]]; then
    if command -v mpicxx >/dev/null 2>&1; then with_mpi=1; else with_mpi=0; fi
fi
with_nccl=${LARTPC_HOROVOD_NCCL:-}
if [[ -z "$with_nccl" ]]; then
    if [[ -n "$torch_cuda" ]] && command -v nvcc >/dev/null 2>&1; then with_nccl=1; else with_nccl=0; fi
fi
features="gloo"
[[ "$with_mpi" == 1 ]] && features+="-mpi"
[[ "$with_nccl" == 1 ]] && features+="-nccl"
key="horovod-${HVD}_torch-${torch_version}_${py_tag}_${features}"

# Already installed and built against this torch: nothing to do.
if "$PYTHON" - "$HVD" "$with_mpi" "$with_nccl" <<'PY' 2>/dev/null; then
import sys
import horovod
import horovod.torch as hvd
want, mpi, nccl = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
ok = (horovod.__version__ == want and hvd.gloo_built()
      and hvd.mpi_built() == mpi and hvd.nccl_built() == nccl)
sys.exit(0 if ok else 1)
PY
    echo "horovod ${HVD} already installed (${features}, torch ${torch_version})"
    exit 0
fi

wheel_dir="$CACHE/$key"
# shellcheck source=jobs/env/wheel_cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/wheel_cache.sh"
install_cached_wheel "$PYTHON" "$wheel_dir" horovod && exit 0

echo "building horovod ${HVD} from source (${features}, torch ${torch_version}, ${py_tag}); a cold build takes ~3 min on 2 cores"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download --no-deps --no-binary :all: "horovod==${HVD}" -d "$work"
tar -xzf "$work/horovod-${HVD}.tar.gz" -C "$work"
src="$work/horovod-${HVD}"

# The C++17 fix: the top-level project and the PyTorch extension.
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" || {
    echo "install_horovod.sh: C++17 patch did not apply to $src/horovod/torch/CMakeLists.txt" >&2
    exit 1
}

# Horovod's build needs these in the target environment (no build isolation,
# so it compiles against the torch that is installed there).
"$PYTHON" -m pip install -q cloudpickle psutil pyyaml packaging cffi

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_WITH_GLOO=1
if [[ "$with_mpi" == 1 ]]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
if [[ "$with_nccl" == 1 ]]; then
    export HOROVOD_GPU_OPERATIONS=NCCL
else
    unset HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_BROADCAST
    # CPU torch: keep CMake from enabling CUDA just because an nvcc is on PATH.
    sed -i 's/^check_language(CUDA)$/set(CMAKE_CUDA_COMPILER "")/' "$src/CMakeLists.txt"
    sed -i 's/^    find_package(CUDAToolkit)$/    set(CUDAToolkit_BIN_DIR "")/' "$src/CMakeLists.txt"
fi
MAKEFLAGS="-j$(nproc)"
export MAKEFLAGS

"$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src"
cache_and_install_wheel "$PYTHON" "$work/dist" "$wheel_dir" horovod
