#!/usr/bin/env bash
# Install spconv matching the torch in the environment: the CUDA build (spconv-cu12x)
# when torch has CUDA, else the CPU build `spconv` (patched at import, see
# lartpc/models/sparse_compat.py). Usage: install_spconv.sh PYTHON [auto|PACKAGE]
set -euo pipefail
PYTHON=${1:-python}
want=${2:-auto}
if [[ "$want" == auto ]]; then
    cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")')
    if [[ -z "$cuda" ]]; then
        want=spconv
    else
        major=${cuda%%.*}
        minor=${cuda#*.}; minor=${minor%%.*}
        # spconv publishes cu120, cu121, cu124, cu126 wheels for CUDA 12; newest not above.
        tag=120
        for t in 121 124 126; do
            if (( major > 12 || (major == 12 && minor >= ${t:2:1}) )); then tag=$t; fi
        done
        want="spconv-cu${tag}"
    fi
fi
installed=$("$PYTHON" -m pip list --format=freeze 2>/dev/null | grep -i '^spconv' | cut -d= -f1 || true)
if [[ "${installed,,}" == "${want,,}" ]]; then
    exit 0
fi
if [[ -n "$installed" ]]; then
    "$PYTHON" -m pip uninstall -q -y "$installed"
fi
echo "installing $want"
"$PYTHON" -m pip install -q "$want>=2.3.6"
