#!/usr/bin/env bash
# The GPU measurements issues 35 and 36 still need, in one call, most important first.
#
#   bash jobs/local/gpu_issues.sh OUT            # on one H100/H200
#   DEVICE=cpu bash jobs/local/gpu_issues.sh OUT # smoke run at 450 x 450 (this script's check)
#   SCAN_TOO=1 bash jobs/local/gpu_issues.sh OUT # and the minibatch scans (~15 min more)
#
# On the lent GPU machine, whose call returns at most 8 files and has a time limit:
#   DEADLINE_S=540 PACK=$OUT/gpu-issues.tar.gz bash jobs/local/gpu_issues.sh /tmp/gi
# DEADLINE_S: seconds from the start after which no part runs on (the running one is
# stopped and noted as such); PACK: a .tar.gz of OUT written at the end, also when the
# deadline cut the run short; ONLY: the names of the parts to run (as OUT/parts.txt
# names them; the others are skipped); TRAIN_SECONDS: part 1b's trainings' length (40).
#
# Needs gpu-bundle/ beside the tree on the GPU host (`make gpu-bundle` where the package
# index is reachable). Every part writes into OUT as soon as it ends, so a run cut short
# keeps what finished; a failing part is noted in OUT/parts.txt and the rest still run.
# Expected on an H200: ~9 minutes to the end of part 3, ~12 with parts 4-5, without the
# scan (BENCHMARKS.md, "One call for the open GPU measurements"). PACK must lie outside
# OUT.
set -u
OUT=${1:?usage: gpu_issues.sh OUT}
DEVICE=${DEVICE:-cuda}
DEADLINE_S=${DEADLINE_S:-0}  # 0: no deadline
PACK=${PACK:-}
ONLY=${ONLY:-}  # space-separated part names: run only those (a rerun in a short lease)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -n "$PACK" ]; then
    mkdir -p "$(dirname "$PACK")"
    PACK=$(cd "$(dirname "$PACK")" && pwd)/$(basename "$PACK")
    trap 'tar czf "$PACK" -C "$(dirname "$OUT")" "$(basename "$OUT")"' EXIT
fi
cd "$(dirname "$0")/../.." || exit 1  # the tree's root
G=$OUT/gpu-bench
if [ "$DEVICE" = cuda ]; then
    bash gpu-bundle/install.sh --require-cuda > "$OUT/install.txt" 2>&1 || {
        echo "install failed: see $OUT/install.txt"; exit 1; }
    export PYTHONPATH=$PWD:$PWD/gpu-bundle/site
    COMMON=(--train-seconds 40)
    SCAN=(--scan-seeds 0 --scan-seconds 30 --scan-batches "${SCAN_BATCHES:-7,14,28,56,112,256}")
else  # gpu_bench's smoke run (450 x 450, trainings of 2 epochs) of the CUDA-free parts
    COMMON=(--quick); SCAN=()
fi
PY=${PYTHON:-python3}
part() {  # part NAME COMMAND...: run one part, log it, keep going on failure
    local name=$1; shift
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    local t0=$SECONDS rc limit=()
    if [ "$DEADLINE_S" -gt 0 ]; then  # stopped (with its children) at the deadline
        limit=(timeout -k 5 $((DEADLINE_S - SECONDS)))
        if [ "${limit[3]}" -lt 10 ]; then
            echo "$name: not run, deadline (${DEADLINE_S} s) reached" | tee -a "$OUT/parts.txt"
            return
        fi
    fi
    "${limit[@]}" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"; rc=$?
    if [ "${#limit[@]}" -gt 0 ] && { [ "$rc" = 124 ] || [ "$rc" = 137 ]; }; then
        echo "$name: stopped at the deadline (${DEADLINE_S} s) after $((SECONDS - t0)) s" \
            | tee -a "$OUT/parts.txt"
    else
        echo "$name: exit $rc, $((SECONDS - t0)) s" | tee -a "$OUT/parts.txt"
    fi
}
bench() {  # bench ONLY [FLAGS]: gpu_bench steps into $G, results copied into OUT
    local only=$1; shift
    part "gpu-bench-${only%%,*}" "$PY" -m lartpc.jobs.local.gpu_bench --out "$G" \
        --device "$DEVICE" "${COMMON[@]}" --only "$only" --results "$OUT/results.json" "$@"
    cp "$G"/*.json "$G"/summary.md "$OUT/" 2>/dev/null
}

part env "$PY" -m lartpc env
# 0. issue 36: one store of 700 events for parts 1a-1b (outside OUT: PACK returns OUT)
EV=${EVENTS_DIR:-$(mktemp -d)}/events
# (the CPU smoke run bounds its trainings by epochs: under load a short wall-clock limit,
# which counts the start-up too, left one step)
# (the Triton kernels need a GPU or the interpreter: on a CPU the probe times the graph's
# operations eagerly instead)
if [ "$DEVICE" = cuda ]; then NEV=700 EVDS=1 SECS=${TRAIN_SECONDS:-40} BOUND=()
    WAYS=auto,triton,torch
else NEV=70 EVDS=8 SECS=300 BOUND=(--set train.epochs=2) WAYS=auto,graph,torch; fi
# the generator's sim3 physics by default: the events the earlier leases measured on, so
# that images/s compare (PHYSICS=sim4 for the latest)
part events "$PY" -m lartpc simulate --out "$EV" --events "$NEV" --downsample "$EVDS" \
    --workers "$(nproc)" --overwrite --physics "${PHYSICS:-sim3}"
# 1a. how fast the loader alone hands over batches with their tables (one made in the
#    caller's thread, the tables by one replayed CUDA graph where padded (auto), by the
#    Triton kernels and by torch operations; a whole
#    pass with 1 and 3 prefetch threads, and with 4 and 8 loader processes, their tables
#    compiled by numba, then by torch operations), and the CPU time it costs the
#    training process per batch
part loader-probe "$PY" -m lartpc.jobs.local.loader_probe "$EV" --device "$DEVICE" \
    --threads 1,3 --processes 4,8 --tables "$WAYS"
cp "$OUT/loader-probe.out" "$OUT/loader-probe.json" 2>/dev/null
# 1b. SCNet's graphed training (torch layers, tables built in the loader, one CUDA graph
#    a step; second lease of 2026-11-28: 1,972.7 images/s with one loader thread and the
#    tables' Triton kernels, 2,063.7 with three; the 8-process trainings failed, fixed
#    since; the padded tables now by one replayed CUDA graph a batch): three loader
#    threads, then one (8 loader processes and Adam as one fused kernel in 3b, after
#    issue 35's parts)
train_graph() {  # train_graph NAME SETTINGS...
    local name=$1; shift
    local sets=() kv
    for kv in "$@"; do sets+=(--set "$kv"); done
    part "$name" "$PY" -m lartpc bench train --ranks 1 --backend none --device "$DEVICE" \
        --data "$EV" --downsample "$EVDS" --seconds "$SECS" --model scnet --loader sparse \
        --set model.sparse=torch --set data.rulebooks=loader --set train.cuda_graph=true \
        "${BOUND[@]}" "${sets[@]}"
    cp "$OUT/$name.out" "$OUT/$name.json" 2>/dev/null
}
#    Since 2026-11-30 first with the table cache (data.table_cache: every event's tables
#    made when the loader starts, each batch's joined on the CPU and sent with the batch
#    in one copy), three loader threads, then the same with Adam as one fused kernel
#    (the step's thread then makes 9 torch operations a graphed step instead of 33:
#    what is left of the loop's own cost), then without the cache (the cache with one
#    thread in 3b)
train_graph train-scnet-torch-graph-threads-3-table-cache data.prefetch_threads=3 \
    data.table_cache=true
train_graph train-scnet-torch-graph-threads-3-table-cache-fused-adam \
    data.prefetch_threads=3 data.table_cache=true train.optimizer_impl=fused
train_graph train-scnet-torch-graph-threads-3 data.prefetch_threads=3
# 2. the CUDA tests: both ways of building ahead (equality, no synchronisation), the
#    batches from loader processes, the tables' kernels, the captured step (equal to the
#    eager one, and the bench's capture), the fused stages, the device-dense loader's
#    page-locked pixels, torch.distributed on CUDA with CPU-tensor collectives, and a
#    DDP-wrapped graphed training on one torchrun rank (captured, its exchange timed by
#    CUDA events: since 2026-12-01)
part gpu-tests "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_sparse_torch.py \
    tests/test_table_kernels.py tests/test_graphed_step.py tests/test_rulebooks.py \
    tests/test_loader_processes.py tests/test_fused_stage2.py tests/test_fused_stem.py \
    tests/test_table_graph.py tests/test_table_cache.py \
    tests/test_gpu.py::test_device_dense_pixels_wait_page_locked_for_their_copy \
    tests/test_dist.py::test_torch_ranks_on_cuda_reduce_cpu_and_cuda_tensors \
    tests/test_device_spans.py
# 3. issue 35: the stem's launches and ways of summing its taps (second lease of
#    2026-11-28: dot at 64:4 the fastest, band and patch slower; hoist since), the fused second
#    stage's (64:8:64 hybrid the fastest, 4.9 ms against cuDNN's 6.9: now the default;
#    the igrad backward since, its input gradient by Triton instead of cuDNN, the map
#    backward, both its gradients by Triton, and vec, the forward's gathers as 16-byte
#    copies):
#    accuracy, the stage alone and the step; then JishNet at the fastest accurate
#    launches of both, stage by stage (each with its heaviest kernels), with its peak
#    memory, the largest minibatch that fits, and its step as one CUDA graph against
#    eager, back to back (how much of the step is the host's); then its training with
#    the step as one graph (3a)
if [ "$DEVICE" = cuda ]; then
    part stem-check "$PY" -m lartpc.jobs.local.stem_check --out "$OUT/stem-check"
    part stage2-check "$PY" -m lartpc.jobs.local.stem_check --out "$OUT/stage2-check" \
        --stage 2
    part fastest-kernels "$PY" -m lartpc.jobs.local.fastest_kernels \
        "$OUT/stem-check/stem-check.json" "$OUT/stage2-check/stage2-check.json"
    cp "$OUT/fastest-kernels.out" "$OUT/fastest-kernels.json" 2>/dev/null
    fastest() {  # fastest KEY: that field of fastest-kernels.json ("" without it)
        "$PY" -c "import json, sys; print(json.load(sys.stdin)['$1'])" \
            < "$OUT/fastest-kernels.json" 2>/dev/null || echo ""
    }
    read -r -a FASTEST < <(fastest flags)
    read -r -a FASTEST_SETS < <(fastest train_flags)
    # without a pick (a check failed or did not run), the stages that model.stem=auto
    # and model.stage2=auto train with on CUDA, not bench model's library default
    [ "${#FASTEST[@]}" -gt 0 ] || FASTEST=(--stem fused --stage2 fused)
    echo "fastest kernels: ${FASTEST[*]}" | tee -a "$OUT/parts.txt"
    part model-jishnet-stages "$PY" -m lartpc bench model --model jishnet --device cuda \
        --batch-per-rank 7 --elu-after-pool --cudnn-benchmark --amp bf16 --channels-last \
        "${FASTEST[@]}" --stages --repeats 10 --max-batch --cuda-graph
fi
# 3a. issue 35 in training: JishNet through the loop (device-dense loader, 3600 x 3600,
#    bf16, NHWC, the fastest accurate launches), its step one CUDA graph
#    (train.cuda_graph), beside the bare step, graphed too, of the same batches (on a
#    CPU: float32 at the model's default layers, the static step without a graph)
if [ "$DEVICE" = cuda ]; then JISH=(--set train.amp=bf16 --set model.channels_last=true)
else JISH=(); FASTEST_SETS=(); fi
part train-jishnet-graph "$PY" -m lartpc bench train --ranks 1 --backend none \
    --device "$DEVICE" --data "$EV" --downsample "$EVDS" --seconds "$SECS" --model jishnet \
    --set model.elu_after_pool=true --set train.cuda_graph=true "${JISH[@]}" "${BOUND[@]}" \
    "${FASTEST_SETS[@]}"
cp "$OUT/train-jishnet-graph.out" "$OUT/train-jishnet-graph.json" 2>/dev/null
if [ "$DEVICE" = cuda ]; then
    # JishNet's stages as above with the stem's empty blocks left out
    # (model.stem_skip_empty: the same numbers, no longer a dense first layer; on
    # 3600 x 3600 events ~1.3 % of its blocks of 64 outputs have charge under them)
    part model-jishnet-stages-skip-empty "$PY" -m lartpc bench model --model jishnet \
        --device cuda --batch-per-rank 7 --elu-after-pool --cudnn-benchmark --amp bf16 \
        --channels-last "${FASTEST[@]}" --stem fused --stem-skip-empty --stages --repeats 10 \
        --cuda-graph  # fused after the picks: skipping empty blocks is the fused stem's
fi
# 3b. issue 36 again: the graphed training with the batches made in 8 loader processes
#    (tables on their CPUs), and the table cache with one loader thread (Adam as one
#    fused kernel with the cache: in 1b since 2026-11-30)
train_graph train-scnet-torch-graph-processes-8 data.loader_processes=8
train_graph train-scnet-torch-graph-threads-1-table-cache data.prefetch_threads=1 \
    data.table_cache=true
# 3c. issue 35: JishNet's graphed training as in 3a with the stem's empty blocks left out
#    (model.stem_skip_empty, as model-jishnet-stages-skip-empty; not a dense first layer)
if [ "$DEVICE" = cuda ]; then
    part train-jishnet-graph-skip-empty "$PY" -m lartpc bench train --ranks 1 \
        --backend none --device cuda --data "$EV" --downsample "$EVDS" --seconds "$SECS" \
        --model jishnet --set model.elu_after_pool=true --set train.cuda_graph=true \
        "${JISH[@]}" "${FASTEST_SETS[@]}" --set model.stem=fused \
        --set model.stem_skip_empty=true
    cp "$OUT/train-jishnet-graph-skip-empty.out" "$OUT/train-jishnet-graph-skip-empty.json" \
        2>/dev/null
fi
# 4. (since the second lease of 2026-11-28 part of 3)
# 5. issue 36's own command (spconv, implicit GEMM: 719.6 images/s on the H200 on
#    2026-11-28), the baseline on this machine, and the bare SCNet benches
bench 'train-scnet-sparse'
bench 'model-scnet-default,model-scnet-implicit-gemm,model-scnet-torch,model-scnet-torch-graph'
# 6. with SCAN_TOO=1: the minibatch scans (~5 min each on a GPU; SCAN_BATCHES: fewer
#    minibatches): first the torch layers as issue 36 trains them fastest (the step's
#    graph, the table cache, three loader threads), then spconv (implicit GEMM) and the
#    torch layers without the graph
if [ "${SCAN_TOO:-0}" = 1 ]; then
    bench 'minibatch-scnet-torch-graph' "${SCAN[@]}"
    bench 'minibatch-scnet,minibatch-scnet-torch' "${SCAN[@]}"
    cp -r "$G/minibatch-torch-graph" "$G/minibatch" "$G/minibatch-torch" "$OUT/" 2>/dev/null
fi
echo "done: $OUT" | tee -a "$OUT/parts.txt"
