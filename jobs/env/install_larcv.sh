#!/usr/bin/env bash
# Build and install larcv3 (PyPI name `larcv`) into the given Python environment.
#
# larcv 3.5.1 ships only as a C++ source distribution. It needs the HDF5 headers
# (libhdf5-dev) and, because its CMakeLists predates CMake 4 (which pip's build
# environment brings), CMAKE_POLICY_VERSION_MINIMUM=3.5. A cold build takes ~6 min
# on 2 idle cores (11.7 min of CPU); the wheel is cached, keyed by larcv, Python,
# numpy's major version and HDF5's version, so a reinstall takes seconds.
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

# HDF5: the headers the C++ build needs and the shared library the wheel links to, for
# a cached wheel too. Looked for where an HPC module or conda puts them (HDF5_ROOT,
# HDF5_DIR, HDF5_HOME, CPATH, C_INCLUDE_PATH; the build's CMake is given the one found),
# then in the system's include folders (libhdf5-dev, libhdf5_serial). Without them it
# installs libhdf5-dev (root or sudo, apt); failing that, larcv is left out with a
# warning: the larcv3 options then say so, and CI's LARTPC_REQUIRE_LARCV=1 turns its
# tests' skips into failures.
hdf5_include() {
    local dir roots=()
    for root in "${HDF5_ROOT:-}" "${HDF5_DIR:-}" "${HDF5_HOME:-}"; do
        [[ -n $root ]] && roots+=("$root/include")
    done
    IFS=: read -r -a paths <<< "${CPATH:-}:${C_INCLUDE_PATH:-}"
    for dir in "${roots[@]}" "${paths[@]}" /usr/include/hdf5/serial /usr/include; do
        if [[ -n $dir && -f $dir/H5public.h && -f $dir/hdf5.h ]]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}
if ! h5include=$(hdf5_include); then
    echo "install_larcv.sh: HDF5 headers missing; installing libhdf5-dev"
    if [[ $(id -u) == 0 ]]; then sudo=(); else sudo=(sudo -n); fi
    export DEBIAN_FRONTEND=noninteractive
    if ! { "${sudo[@]}" apt-get install -y -q libhdf5-dev >/dev/null 2>&1 \
           || { "${sudo[@]}" apt-get update -q >/dev/null 2>&1 \
                && "${sudo[@]}" apt-get install -y -q libhdf5-dev >/dev/null; }; } \
       || ! h5include=$(hdf5_include); then
        echo "install_larcv.sh: WARNING: no HDF5 headers (set HDF5_ROOT to an HDF5" \
             "install, or install libhdf5-dev: needs root and apt); larcv not installed," \
             "so the larcv3 options are unavailable" >&2
        exit 0
    fi
fi
case $h5include in  # outside the system's folders: the build's CMake looks there first
    /usr/include|/usr/include/hdf5/serial) ;;
    *) export HDF5_ROOT=${h5include%/include} ;;
esac
echo "install_larcv.sh: HDF5 headers in $h5include"

# the wheel links to this HDF5's shared library: part of the cache key
hdf5=$(awk '/define H5_VERS_(MAJOR|MINOR|RELEASE) /{v = v (v ? "." : "") $3} END {print v}' \
       "$h5include/H5public.h")
key="larcv-${LARCV}_${py_tag}_numpy${np_major}_hdf5-${hdf5}"
wheel_dir="$CACHE/$key"
# shellcheck source=jobs/env/wheel_cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/wheel_cache.sh"
install_cached_wheel "$PYTHON" "$wheel_dir" larcv && exit 0

echo "building larcv ${LARCV} from source (${py_tag}); a cold build takes ~6 min on 2 idle cores"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CMAKE_POLICY_VERSION_MINIMUM=3.5
ncores=$(nproc)
export CMAKE_BUILD_PARALLEL_LEVEL="$ncores" MAKEFLAGS="-j$ncores"
"$PYTHON" -m pip wheel --no-deps --no-binary larcv -w "$work/dist" "larcv==${LARCV}"
cache_and_install_wheel "$PYTHON" "$work/dist" "$wheel_dir" larcv
