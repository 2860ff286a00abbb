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
# Every spconv build installed (the CPU build and a CUDA one can sit side by side, e.g.
# after `pip install .[sparse,gpu]`): one of the wanted name at a version the project
# supports stays; any other is removed before the wanted one goes in.
mapfile -t installed < <("$PYTHON" -m pip list --format=freeze 2>/dev/null | grep -i '^spconv' || true)
keep=no
others=()
for line in "${installed[@]}"; do
    name=${line%%==*}
    version=${line#*==}
    if [[ "${name,,}" == "${want,,}" ]] && "$PYTHON" - "$version" <<'PY'
import re, sys
sys.exit(0 if tuple(map(int, re.findall(r"\d+", sys.argv[1])[:3])) >= (2, 3, 6) else 1)
PY
    then
        keep=yes
    else
        others+=("$name")
    fi
done
if [[ ${#others[@]} -gt 0 ]]; then
    "$PYTHON" -m pip uninstall -q -y "${others[@]}"
fi
if [[ $keep == yes ]]; then
    exit 0
fi
echo "installing $want"
"$PYTHON" -m pip install -q "$want>=2.3.6"
