"""JishNet and SCNet: exact sizes, shapes at any image size, training on real events."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from train_helpers import HEAVY_TIMEOUT_S

from lartpc.bench.model import batch_from_events
from lartpc.data.store import EventStore
from lartpc.errors import ConfigError
from lartpc.geometry import Geometry
from lartpc.models import build, num_parameters
from lartpc.models.losses import build_loss
from lartpc.sim import simulate_event


def events_at(downsample: int, n: int, seed: int = 5):
    geometry = Geometry(downsample=downsample)
    return [simulate_event(i, seed, geometry) for i in range(n)], geometry.shape


def finite_grads(model) -> bool:
    return all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name,count", [("jishnet", 1_335_817), ("scnet", 1_703_999)])
def test_parameter_counts_at_full_resolution(name, count):
    model = build(name, image_size=3600)
    assert num_parameters(model) == count
    assert model.head.in_features == 256 * 9 * 9 == 20736


def test_jishnet_spatial_sizes_at_3600():
    model = build("jishnet", 3600).to("meta")
    sizes = []
    for conv in model.convs:
        conv.register_forward_hook(lambda m, i, o: sizes.append(o.shape[-1]))
    out = model.forward_tensor(torch.empty(2, 1, 3600, 3600, device="meta"))
    assert sizes == [3600, 720, 145, 37]  # conv outputs; pools give 720, 144, 36, 9
    assert out.shape == (2, 5)


@pytest.mark.sparse
def test_scnet_spatial_sizes_at_3600():
    model = build("scnet", 3600)
    shapes = []
    for pool in model.pools:
        pool.register_forward_hook(lambda m, i, o: shapes.append(list(o.spatial_shape)))
    events, _ = events_at(1, 2)
    out = model(batch_from_events(events, (3600, 3600), "sparse"))
    assert shapes == [[720, 720], [144, 144], [36, 36], [9, 9]]
    assert out.shape == (2, 5) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["jishnet", "scnet"])
@pytest.mark.parametrize("size", [450, (450, 620), (533, 450), (450, 1199)])
def test_output_shape_at_other_sizes(name, size):
    events, _ = events_at(8, 3)  # real 450 x 450 events, placed in larger images too
    model = build(name, image_size=size)
    seen = []
    model.head.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
    batch = batch_from_events(events, model.image_size, model.input_kind)
    with torch.no_grad():
        out = model(batch)
    assert out.shape == (3, 5) and torch.isfinite(out).all()
    # the trunk's real output (torch / spconv pooling arithmetic) is what the head expects
    assert seen == [(3, 256, *model.out_hw)]
    assert model.head.in_features == 256 * model.out_hw[0] * model.out_hw[1]


@pytest.mark.sparse
def test_max_head_sees_an_event_the_same_wherever_it_lies():
    """model.head=max: an event moved by SCNet's total stride (5*5*4*4 = 400 pixels)
    gives the same map one cell over, so the same logits; the study's flattened head
    weighs each cell on its own and tells the two apart."""
    events, _ = events_at(8, 3)  # real 450 x 450 events
    size = (450, 1250)  # trunk map 1 x 3: columns 0-399, 400-799, 800-1199
    here = batch_from_events(events, size, "sparse")
    there = batch_from_events(events, size, "sparse")
    there.coords = there.coords.clone()
    there.coords[:, 2] += 400
    torch.manual_seed(0)
    pooled, flat = build("scnet", size, head="max"), build("scnet", size)
    with torch.no_grad():
        assert torch.allclose(pooled(here), pooled(there), atol=1e-5)
        assert not torch.allclose(flat(here), flat(there), atol=1e-3)
    assert pooled.head.in_features == 256 and flat.head.in_features == 256 * 3
    assert build("jishnet", size, head="max").head.in_features == 256
    with pytest.raises(ConfigError, match="model.head='mean': expected one of flatten, max"):
        build("scnet", size, head="mean")


@pytest.mark.parametrize("size,jish,sc", [
    (3600, (9, 9), (9, 9)), (1800, (4, 4), (4, 4)), (900, (2, 2), (2, 2)),
    # JishNet's k4/p2 convolutions grow the map by one pixel; the poolings floor
    (1199, (3, 3), (2, 2)), ((450, 1199), (1, 3), (1, 2))])
def test_flatten_size_follows_the_image_size(size, jish, sc):
    assert build("jishnet", size).out_hw == jish
    assert build("scnet", size).out_hw == sc
    assert build("scnet", size).head.in_features == 256 * sc[0] * sc[1]


@pytest.mark.parametrize("name", ["jishnet", "scnet"])
def test_forward_backward_on_real_events_and_training_lowers_loss(name, events_dir):
    torch.manual_seed(0)
    store = EventStore(events_dir)
    events = store.read_many(range(6))
    model = build(name, image_size=store.geometry.shape)
    batch = batch_from_events(events, store.geometry.shape, model.input_kind)
    assert (batch.features if name == "scnet" else batch.dense).abs().sum() > 0
    loss_fn = build_loss("ce")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = loss_fn(model(batch), batch.labels)
        loss.backward()
        assert finite_grads(model)
        assert any(p.grad.abs().sum() > 0 for p in model.convs[0].parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("option", ["elu_after_pool", "channels_last"])
def test_jishnet_speed_options_compute_the_same_function(option):
    events, shape = events_at(8, 2)
    batch = batch_from_events(events, shape, "dense")
    batch.dense *= 0.05  # charge to O(1) so that ELU's negative side is exercised
    torch.manual_seed(3)
    ref = build("jishnet", shape)
    fast = build("jishnet", shape, **{option: True})
    fast.load_state_dict(ref.state_dict())
    outs = []
    for m in (ref, fast):
        out = m(batch)
        out.square().sum().backward()
        outs.append((out.detach(), m.convs[0].weight.grad))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-3, atol=1e-5)


def test_models_declare_their_input_kind_and_reject_the_other():
    events, shape = events_at(8, 2)
    for name, kind, other in [("jishnet", "dense", "sparse"), ("scnet", "sparse", "dense")]:
        model = build(name, shape)
        assert model.input_kind == kind
        with pytest.raises(ConfigError, match=f"needs {kind} batches"):
            model(batch_from_events(events, shape, other))


def test_registry_errors():
    assert build("jishnet", 450).image_size == build("jishnet", (450, 450)).image_size
    with pytest.raises(ConfigError, match="unknown model 'resnet'"):
        build("resnet", 450)
    with pytest.raises(ConfigError, match="unknown option.*algo"):
        build("jishnet", 450, algo="native")
    with pytest.raises(ConfigError, match="too small for JishNet"):
        build("jishnet", 100)
    with pytest.raises(ConfigError, match="too small for SCNet"):
        build("scnet", (3600, 300))
    with pytest.raises(ConfigError, match="image_size"):
        build("scnet", (0, 450))
    with pytest.raises(ConfigError, match=r"got \(1, 1, 450, 451\)"):
        build("jishnet", 450).forward_tensor(torch.ones(1, 1, 450, 451))


def test_scnet_gpu_options_are_refused_on_cpu():
    from spconv.cppconstants import CPU_ONLY_BUILD

    events, shape = events_at(8, 2)
    batch = batch_from_events(events, shape, "sparse")
    with pytest.raises(ConfigError, match="half=True needs CUDA"):
        build("scnet", shape, half=True)(batch)
    if CPU_ONLY_BUILD:
        with pytest.raises(ConfigError, match="needs a CUDA build"):
            build("scnet", shape, algo="implicit_gemm")
    with pytest.raises(ConfigError, match="expected one of"):
        build("scnet", shape, algo="fast")
    out = build("scnet", shape, algo="native")(batch)
    assert out.shape == (2, 5)


def test_scnet_algorithms_are_the_model_algo_values():
    """SCNet's spconv algorithms are config's model.algo values but ``auto`` (one list,
    in lartpc.models), each building its own spconv algorithm; a name not among them
    is refused listing them."""
    from spconv.core import ConvAlgo

    from lartpc.config import CHOICES
    from lartpc.models import scnet

    assert ("auto", *scnet.ALGOS) == CHOICES["model.algo"]
    model = build("scnet", 400, algo="native")
    assert {m.algo for m in (*model.convs, *model.pools)} == {ConvAlgo.Native}
    with pytest.raises(ConfigError, match="algo='auto': expected one of native, "
                                          "implicit_gemm, split_implicit_gemm"):
        build("scnet", 400, algo="auto")


def test_scnet_batch_without_pixels_gives_logits():
    model = build("scnet", 450)
    batch = batch_from_events(events_at(8, 2)[0], (450, 450), "sparse")
    batch.coords, batch.features = batch.coords[:0], batch.features[:0]
    out = model(batch)
    assert out.shape == (2, 5)
    # an empty image is classified by the head's biases alone: same logits for both
    torch.testing.assert_close(out[0], out[1])


def run_bench(capsys, *argv) -> tuple[int, dict | str]:
    from lartpc.cli import main

    rc = main(["bench", "model", *argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else err)


@pytest.mark.parametrize("name", ["jishnet", "scnet"])
def test_bench_model_prints_json_on_real_events(name, capsys, events_dir):
    rc, res = run_bench(capsys, "--model", name, "--data", str(events_dir), "--batch-per-rank", "2",
                        "--repeats", "1", "--warmup", "0")
    assert rc == 0
    assert res["model"] == name and res["size"] == [900, 900] and res["batch_per_rank"] == 2
    assert res["active_pixels"] == int(EventStore(events_dir).pixel_counts()[:2].sum()) > 0
    if name == "jishnet":  # 5 significant digits of the hand count
        assert res["train_gflop_per_image"] == pytest.approx(
            jishnet_train_flops(2, 900) / 2 / 1e9, rel=1e-5)
    else:  # spconv's kernels are invisible to the counter
        assert res["train_gflop_per_image"] is None and res["achieved_tflops"] is None
    assert res["images_per_s"] == pytest.approx(2 / res["forward_backward_ms"] * 1e3, rel=1e-2)
    assert res["peak_memory_kind"].startswith("growth of process peak RSS")
    assert isinstance(res["peak_memory_bytes"], int) and res["peak_memory_bytes"] >= 0


def jishnet_train_flops(batch: int, size: int) -> int:
    """Hand count of JishNet's forward+backward multiply-adds x 2 on a square image.

    Each conv and linear layer costs ``2 * MACs`` forward, as much again for the weight
    gradient, and again for the input gradient, except the first conv (the image needs
    none). Elementwise work (ELU, pooling, loss) is not counted, as FlopCounterMode.
    """
    from lartpc.models.jishnet import STAGES

    total, cin, s = 0, 1, size
    for i, (cout, k, p, pool) in enumerate(STAGES):
        o = s + 2 * p - k + 1
        total += 2 * batch * cout * o * o * cin * k * k * (2 if i == 0 else 3)
        s, cin = o // pool, cout
    for a, b in ((cin * s * s, 32), (32, 5)):
        total += 3 * 2 * batch * a * b
    return total


def test_jishnet_flop_count_equals_hand_count():
    from lartpc.bench.model import train_flops
    from lartpc.models.losses import build_loss

    # 900 -> conv 900 -> pool 180 -> 180 -> 36 -> 37 -> 9 -> 10 -> 2: flat 256*2*2
    assert jishnet_train_flops(2, 900) == 10_623_591_552
    assert train_flops("jishnet", (900, 900), 2, {}, build_loss("ce")) == 10_623_591_552


def test_bench_model_generates_events_and_rejects_bad_sizes(capsys):
    rc, res = run_bench(capsys, "--model", "scnet", "--size", "450", "--batch-per-rank", "2",
                        "--repeats", "1")
    assert rc == 0 and res["size"] == [450, 450] and res["active_pixels"] > 0
    rc, err = run_bench(capsys, "--model", "scnet", "--size", "1000")
    assert rc == 2 and "--size 1000" in err
    rc, err = run_bench(capsys, "--model", "scnet", "--size", "450", "--channels-last")
    assert rc == 2 and "--channels-last: not an option of --model scnet" in err


def test_batch_from_events_dense_and_sparse_agree():
    events, shape = events_at(8, 3)
    dense = batch_from_events(events, shape, "dense")
    sparse = batch_from_events(events, shape, "sparse")
    rebuilt = torch.zeros_like(dense.dense)
    c = sparse.coords.long()
    rebuilt[c[:, 0], 0, c[:, 1], c[:, 2]] = sparse.features[:, 0]
    assert torch.equal(rebuilt, dense.dense)
    assert np.array_equal(dense.labels.numpy(), [e.label for e in events])


def _conv_flops_by_hand(size: int, batch: int) -> float:
    """JishNet's convolution work from its STAGES table: forward 2*Cin*Cout*k^2 per output
    pixel; backward twice that (weight and input gradients), except conv1, whose input
    needs no gradient."""
    from lartpc.geometry import pooled_size
    from lartpc.models.jishnet import STAGES

    total, cin, s = 0.0, 1, size
    for i, (cout, k, p, pool) in enumerate(STAGES):
        out = pooled_size(s, k, padding=p, stride=1)
        fwd = 2.0 * cin * cout * k * k * out * out * batch
        total += fwd * (2 if i == 0 else 3)
        cin, s = cout, pooled_size(out, pool)
    return total


@pytest.mark.parametrize("elu_after_pool", [False, True])
def test_jishnet_training_flops_match_the_layer_table(elu_after_pool):
    """The FLOP count `lartpc bench model` divides by the step time: at 3600 x 3600 it
    agrees with the count by hand (the head's few MFLOP aside) and with the issue's
    'about 90 GFLOP per image'."""
    from lartpc.bench.model import train_flops
    from lartpc.models.losses import build_loss

    flops = train_flops("jishnet", (3600, 3600), 7, {"elu_after_pool": elu_after_pool},
                        build_loss("paper"))
    by_hand = _conv_flops_by_hand(3600, 7)
    assert flops == pytest.approx(by_hand, rel=1e-3)
    assert 75e9 < flops / 7 < 95e9
    assert train_flops("scnet", (900, 900), 7, {}, build_loss("ce")) is None


def test_peak_table_matches_device_names_and_precisions():
    from lartpc.models.peaks import peak_tflops

    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peak_tflops("NVIDIA H200", "tf32") == 494.7
    assert peak_tflops("Tesla P100-SXM2-16GB", "fp32") == 10.6
    assert peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None
    assert peak_tflops("cpu", "fp32") is None


@pytest.mark.slow
@pytest.mark.timeout(HEAVY_TIMEOUT_S)
def test_bench_model_compile_and_flop_numbers_on_cpu(capsys):
    """The GPU speed options run on CPU too: torch.compile (inductor's CPU backend)
    with ELU after pooling, and the achieved TFLOP/s follow from the FLOP count and the
    measured step (no peak known for a CPU, so no fraction); --peak-tflops gives one."""
    rc, res = run_bench(capsys, "--model", "jishnet", "--size", "300", "--batch-per-rank", "2",
                        "--repeats", "1", "--warmup", "1", "--compile", "--elu-after-pool",
                        "--peak-tflops", "1.0")
    assert rc == 0, res
    assert res["compile"] is True and res["options"]["elu_after_pool"] is True
    gflop = res["train_gflop_per_image"]
    assert gflop == pytest.approx(_conv_flops_by_hand(300, 1) / 1e9, rel=1e-2)
    assert res["achieved_tflops"] == pytest.approx(
        gflop * res["images_per_s"] / 1e3, rel=2e-2)
    # Both are rounded to 5 significant digits, so they agree to 1e-4 at any magnitude
    # (rounding to fixed decimals made this fail at ~0.002 TFLOP/s).
    assert res["fraction_of_peak"] == pytest.approx(res["achieved_tflops"] / 1.0, rel=1e-4)
    assert res["peak_source"] == "--peak-tflops" and res["precision"] == "fp32"
    rc, err = run_bench(capsys, "--model", "scnet", "--size", "450", "--compile")
    assert rc == 2 and "--compile: not an option of --model scnet" in err


@pytest.mark.sparse
def test_spconv_import_prints_no_dependency_warning():
    """SCNet's import path silences the one deprecation warning spconv's build helper
    raises (an SCNet run printed it every time); -W error would make it fatal."""
    code = ("from lartpc.models.sparse_compat import import_spconv\n"
            "import_spconv()\n")
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("fails", [False, True])
def test_max_batch_search_leaves_cudnn_autotuning_as_the_run_set_it(monkeypatch, fails):
    """`bench model --max-batch` searches with cuDNN's default algorithms (autotuning
    each size took minutes), then gives the run's setting back, also when the search
    fails. The GPU's search is stood in; its step runs on a real event."""
    from lartpc.bench import model as bench_model
    from lartpc.bench import stages

    seen = []

    def search(step_at, start):
        seen.append(torch.backends.cudnn.benchmark)
        step_at(start + 1)  # a size the batch is repeated to
        if fails:
            raise RuntimeError("search failed")
        return start + 1, 1000, "minibatch 4: out of memory"

    class Props:
        total_memory = 4096

    monkeypatch.setattr(stages, "max_batch", search)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    events, shape = events_at(8, 2)
    batch = batch_from_events(events, shape, "dense")
    model = build("jishnet", shape)

    def step() -> dict:
        return bench_model._max_batch(model, batch, build_loss("ce"),
                                      lambda: torch.autocast("cpu", enabled=False), 2)

    if fails:
        with pytest.raises(RuntimeError, match="search failed"):
            step()
    else:
        assert step() == {"max_batch": 3, "max_batch_limited_by": "minibatch 4: out of memory",
                          "max_batch_peak_memory_bytes": 1000,
                          "max_batch_memory_per_image_bytes": 333, "gpu_memory_bytes": 4096}
    assert seen == [False] and torch.backends.cudnn.benchmark is True


@pytest.mark.parametrize("error,why", [
    (torch.OutOfMemoryError("CUDA out of memory"), "minibatch 38: out of memory"),
    (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED\nmore"),
     "minibatch 38: RuntimeError: cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"),
])
def test_max_batch_search_stops_at_any_error_a_size_raises(monkeypatch, error, why):
    """`bench model --max-batch`: the largest size that ran, found by doubling from 7 and
    bisecting, whichever error the sizes above it raise (before, only an out-of-memory
    error was caught, and any other lost the whole JSON); the smallest failing size and
    its error are reported. The device's memory calls are stood in on the CPU."""
    from lartpc.bench import stages

    for name in ("empty_cache", "reset_peak_memory_stats", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *a: None)
    tried = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 100 * tried[-1])

    def step_at(b: int) -> None:
        tried.append(b)
        if b > 37:
            raise error

    assert stages.max_batch(step_at, 7) == (37, 3700, why)
    assert tried[:4] == [7, 14, 28, 56]
    assert stages.max_batch(lambda b: None, 2048)[2] == "the search's cap of 4096"


@pytest.mark.timeout(HEAVY_TIMEOUT_S)  # its trainings run under that limit, not 600 s
def test_scnet_trains_with_torch_layers_where_spconv_is_not_installed(train_events_dir,
                                                                        tmp_path):
    """``model.sparse=torch`` needs no spconv: with its import made to fail, the tiny
    SCNet trains to completion on real events, and the same run with spconv's layers
    stops with an error that names spconv (so the block is real)."""
    from train_helpers import run, train_cmd

    block = tmp_path / "block" / "spconv"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text('raise ImportError("spconv is blocked by this test")\n')
    env = {"PYTHONPATH": str(block.parent)}
    sets = ("train.epochs=1",)
    torch_run = run(train_cmd(train_events_dir, tmp_path / "torch", *sets, "model.sparse=torch",
                              config="tiny-scnet"), timeout=HEAVY_TIMEOUT_S, **env)
    assert torch_run.returncode == 0, torch_run.stderr[-3000:]
    assert json.loads((tmp_path / "torch" / "run.json").read_text())["status"] == "completed"
    library = run(train_cmd(train_events_dir, tmp_path / "spconv", *sets, config="tiny-scnet"),
                  timeout=HEAVY_TIMEOUT_S, **env)
    assert library.returncode != 0
    assert "spconv" in library.stderr
