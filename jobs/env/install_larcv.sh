#!/usr/bin/env bash
# Build and install larcv3 (PyPI name `larcv`) into the given Python environment.
#
# larcv 3.5.1 ships only as a C++ source distribution. It needs the HDF5 headers
# (libhdf5-dev) and, because its CMakeLists predates CMake 4 (which pip's build
# environment brings), CMAKE_POLICY_VERSION_MINIMUM=3.5. A cold build takes ~4.5 min
# on 2 cores; the wheel is cached, keyed by larcv, Python and numpy's major version,
# so a reinstall takes seconds.
#
# Usage: jobs/env/install_larcv.sh [PYTHON]
# Environment:
#   LARTPC_WHEEL_CACHE  wheel cache folder (default ~/.cache/lartpc/wheels)
#   LARCV_VERSION       (default 3.5.1)
set -euo pipefail

PYTHON=${1:-python}
LARCV=${LARCV_VERSION:-3.5.1}
CACHE=${LARTPC_WHEEL_CACHE:-$HOME/.cache/lartpc/wheels}

py_tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
np_major=$("$PYTHON" -c 'import numpy; print(numpy.__version__.split(".")[0])')
key="larcv-${LARCV}_${py_tag}_numpy${np_major}"

# Already installed: nothing to do.
if "$PYTHON" - "$LARCV" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
import larcv  # noqa: F401
sys.exit(0 if version("larcv") == sys.argv[1] else 1)
PY
    echo "larcv ${LARCV} already installed"
    exit 0
fi

wheel_dir="$CACHE/$key"
# shellcheck source=jobs/env/wheel_cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/wheel_cache.sh"
install_cached_wheel "$PYTHON" "$wheel_dir" larcv && exit 0

# The HDF5 headers the C++ build links against.
if ! { [[ -f /usr/include/hdf5/serial/hdf5.h ]] || [[ -f /usr/include/hdf5.h ]]; }; then
    echo "install_larcv.sh: HDF5 headers missing; installing libhdf5-dev"
    if [[ $(id -u) == 0 ]]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get install -y -q libhdf5-dev >/dev/null || {
        $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q libhdf5-dev >/dev/null
    }
fi

echo "building larcv ${LARCV} from source (${py_tag}); a cold build takes ~4.5 min on 2 cores"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CMAKE_POLICY_VERSION_MINIMUM=3.5
ncores=$(nproc)
export CMAKE_BUILD_PARALLEL_LEVEL="$ncores" MAKEFLAGS="-j$ncores"
"$PYTHON" -m pip wheel --no-deps --no-binary larcv -w "$work/dist" "larcv==${LARCV}"
cache_and_install_wheel "$PYTHON" "$work/dist" "$wheel_dir" larcv
