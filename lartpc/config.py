"""Typed run configuration: TOML presets shipped with the package plus ``--set`` overrides.

``load_config("paper-jishnet", ["train.time_limit_s=600"])`` resolves a preset (or a
TOML file path) and overrides; every key is checked against the dataclasses below, so a
typo or a wrong type is one clear :class:`~lartpc.errors.ConfigError` before any rank
starts working.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from lartpc import MAX_SEED
from lartpc.data import (
    AUGMENTS,
    BLOSC_CODECS,
    BLOSC_COMPRESS_AT,
    BLOSC_SHUFFLES,
    LOADERS,
    ORIENTS,
    RULEBOOKS,
)
from lartpc.dist import BACKENDS, COMPRESSIONS
from lartpc.errors import ConfigError
from lartpc.models import ALGOS, HEADS, LOSSES, MODELS, SPARSE, STAGE2S, STEMS, kernel_settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    name: str = "jishnet"  #: jishnet | scnet
    loss: str = "ce"  #: ce (cross-entropy on logits) | paper (CE on softmax outputs)
    channels_last: bool = False  #: dense model in NHWC memory layout (GPU speed)
    #: JishNet: ELU after max-pooling. ELU is increasing, so the output is the same as
    #: the published order's, for 1/k^2 of the activation work (~2x faster on CPU).
    elu_after_pool: bool = True
    #: SCNet: spconv algorithm, auto (spconv's choice: implicit GEMM on CUDA builds,
    #: native on CPU builds) | native | implicit_gemm | split_implicit_gemm
    algo: str = "auto"
    #: SCNet: who runs the sparse layers: spconv (the library) | torch (the same layers
    #: as gathers and matrix products on index tables built from the coordinates,
    #: lartpc/models/sparse_torch.py: no spconv rulebooks, no host syncs in the step)
    sparse: str = "spconv"
    #: the classifier head: flatten (the study: the last map flattened into a dense
    #: layer) | max (each channel's maximum over the map: position-free, a diagnostic)
    head: str = "flatten"
    #: JishNet's first stage: auto (fused on CUDA when Triton imports, else library) |
    #: fused (conv + ELU + pool as one Triton kernel, the same function) | library (the
    #: published torch layers)
    stem: str = "auto"
    #: JishNet's fused stem: leave out the blocks of its output with no charge under
    #: any window (their outputs are ELU(bias), their weight-gradient terms 0: the same
    #: numbers, bit for bit). The dense network then exploits the images' emptiness in
    #: its first layer, so it is no longer the study's dense baseline: off by default,
    #: recorded in run.json; needs the fused stem (model.stem=fused, or auto on CUDA)
    stem_skip_empty: bool = False
    #: JishNet's second stage, the same choices (fused: conv + ELU + pool forward as one
    #: Triton kernel, backward through torch's convolution gradients, fused_stage2.py).
    #: auto as model.stem: on the H200 the fused stage took 4.9 ms a step of 7 against
    #: cuDNN's 6.9 (BENCHMARKS.md, 2026-11-28, issue 35)
    stage2: str = "auto"
    #: JishNet's fused kernels' launch on this card (lartpc/models/kernel_settings.py):
    #: "BLOCK:WARPS[:dot|:band|:patch|:hoist]" for the stem,
    #: "BLOCK:WARPS:BLOCK_K[:hybrid|:igrad|:map|:triton[:vec]]" for the second stage; "" =
    #: the kernel's default. The same function (float32 sums in another order), so free
    #: to change on resume
    stem_kernel: str = ""
    stage2_kernel: str = ""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    downsample: int = 1  #: must equal the event store's downsample factor
    eval_fraction: float = 0.1  #: held-out share of the events, chosen by train.seed
    #: a test share, held out of training and of every evaluation during it (scored once
    #: afterwards: ``lartpc evaluate RUN --split test``); 0 = none (the study's two splits)
    test_fraction: float = 0.0
    max_events: int = 0  #: use only the first N events of the store (0 = all)
    loader: str = "auto"  #: auto | blosc | sparse | device-dense (auto: the model's path)
    blosc_codec: str = "lz4"  #: defaults chosen by measurement, see lartpc/data/blosc_cache.py
    blosc_clevel: int = 5
    blosc_shuffle: str = "noshuffle"  #: noshuffle | shuffle | bitshuffle
    #: first-epoch | start: when the blosc loader compresses its shard. start is the
    #: paper's (the whole shard before the first step, so it counts in the data loading
    #: time; the paper presets); first-epoch compresses each event as epoch 0 first uses
    #: it, overlapped with training (BENCHMARKS.md, "Data loading")
    blosc_compress_at: str = "first-epoch"
    prefetch: int = 2  #: batches prepared ahead of the step in a background thread
    #: threads preparing batches (the sparse loader only: each makes whole batches, the
    #: order is kept); for a GPU's graphed SCNet step, which one thread building the
    #: tables does not keep up with (BENCHMARKS.md); whether more pay is not measured yet
    prefetch_threads: int = 1
    #: processes making the sparse loader's training batches, index tables included, on
    #: the CPU (forked; one buffer per batch, one copy to the device); 0 = none: the
    #: prefetch threads make them in the training process, sharing its interpreter with
    #: the step (lartpc/data/processes.py)
    loader_processes: int = 0
    #: none | mirror: mirror each training event on the wire and/or time axis, chosen
    #: by (train.seed, epoch, event); for isotropic events (lartpc/data/augment.py)
    augment: str = "none"
    #: none | start: turn every event (training and evaluation) so the start found in
    #: its image lies at the low-wire, early end, once when it is read; full resolution
    #: only (lartpc/data/orient.py)
    orient: str = "none"
    #: forward | loader: SCNet's spconv rulebooks (model.sparse=torch: its index tables)
    #: built in the forward, or for the next batch in the sparse loader's prefetch thread
    #: (lartpc/models/rulebooks.py, lartpc/models/sparse_torch.py); auto: loader for the
    #: torch layers (torch releases the GIL there) on the sparse loader without
    #: augmentation, forward otherwise (spconv's builders hold the GIL: no gain on a CPU)
    rulebooks: str = "auto"
    #: SCNet's index tables (model.sparse=torch, built in the loader) made once per event
    #: when the loader starts and joined for each batch in one compiled pass, instead of
    #: built from the coordinates every batch (lartpc/models/table_cache.py: the same
    #: integers; ~0.3 MB of memory an event at 3600 x 3600)
    table_cache: bool = False


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    batch_per_rank: int = 7
    epochs: int = 100
    time_limit_s: float = 14400.0  #: from process start; stop in time to evaluate + save
    #: the study's budget per point: training time (steps only, without evaluation and
    #: checkpoints) summed over every segment of the run; once spent the run stops with
    #: run.json's budget_spent true and the job scripts requeue it no more (inf: none)
    budget_s: float = 14400.0
    seed: int = 0
    optimizer: str = "adam"  #: adam | sgd
    #: how torch applies the update: foreach (multi-tensor kernels: the very numbers of
    #: for-loop, faster: issue 36) | for-loop (a tensor at a time, torch's CPU default) |
    #: fused (one kernel per step: fastest, rounds differently)
    optimizer_impl: str = "foreach"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01
    momentum: float = 0.9  #: SGD only
    lr_scaling: str = "none"  #: none | linear | sqrt (learning rate x f(world size))
    warmup_epochs: float = 0.0  #: linear ramp from lr to the scaled lr (Goyal et al.)
    grad_compression: str = "none"  #: none | fp16
    eval_every_epochs: int = 1  #: the paper's cadence: every K epoch ends (and the last)
    #: evaluate instead once every this many training images (all ranks together) have
    #: been seen since the last multiple, whatever the epoch: the learning curve is
    #: sampled at the same images for every GPU count (0: by epochs)
    eval_every_images: int = 0
    #: or once every this many optimizer steps: as many evaluations per step at every
    #: GPU count, so their share of the wall time does not grow with it (0: by epochs)
    eval_every_steps: int = 0
    checkpoint_every_steps: int = 0  #: 0 = at epoch ends and every checkpoint_every_s
    checkpoint_every_s: float = 600.0
    log_flush_steps: int = 20  #: buffered CSV rows per write
    #: read a step's loss and accuracy back with the next step, so that no step waits
    #: for the device (issue 36); false: at once, as before (the same numbers either way)
    overlap_readback: bool = True
    #: seconds between rank 0's progress lines (step, epoch, loss, images/s, step time
    #: split, time left); 0 = only at epoch ends, where a line is always printed
    progress_every_s: float = 30.0
    device: str = "auto"  #: auto | cpu | cuda
    #: none | bf16 | fp16. JishNet: autocast; SCNet: fp16 only (spconv has no bf16
    #: kernels), its sparse trunk in float16 on CUDA. fp16 adds dynamic loss scaling.
    amp: str = "none"
    compile: bool = False  #: torch.compile the dense model (aimed at CUDA; runs on CPU)
    #: forward, loss and backward replayed as one CUDA graph (SCNet with
    #: model.sparse=torch on tables padded to fixed sizes, issue 36; JishNet, issue 35;
    #: lartpc/train/graphed.py); one rank or the torch backend (gradients averaged after
    #: the replay), not Horovod. On a CPU the same static step runs without a graph (no
    #: faster: for testing)
    cuda_graph: bool = False
    threads: int = 0  #: CPU threads per rank (0 = cores / local ranks; SCNet on CPU: 1)
    #: rank 0 writes TensorBoard scalars into <run>/tb/ (needs the tensorboard extra)
    tensorboard: bool = False
    #: gradient noise scale to noise.csv: off | ranks (local vs averaged gradient, >= 2
    #: ranks) | halves (two halves of the minibatch, any ranks) | auto (ranks on >= 2
    #: ranks, off on one: halves changes the measured steps' rounding, so it is asked for)
    noise_scale: str = "auto"
    noise_every_steps: int = 10  #: measure every K steps (cost measured in BENCHMARKS.md)
    #: a new run starts from the model weights of this checkpoint.pt (or run folder's
    #: checkpoint): fine-tuning; its optimizer, counters and RNGs are not taken, and a
    #: run that resumes from its own checkpoint ignores it. "" = random initialisation.
    init_from: str = ""


@dataclass(kw_only=True, slots=True)
class DistConfig:
    backend: str = "auto"  #: auto | horovod | torch | none
    timeout_s: float = 300.0  #: torch.distributed collective timeout


@dataclass(kw_only=True, slots=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


#: Allowed values of every enumerated setting, assembled from the components that own
#: them (models, data, dist; the training loop's own here); the command lines'
#: ``choices=`` come from here (see :func:`choices`).
CHOICES = {
    "model.name": tuple(MODELS),
    "model.loss": LOSSES,
    "model.algo": ALGOS,
    "model.sparse": SPARSE,
    "model.head": HEADS,
    "model.stem": STEMS,
    "model.stage2": STAGE2S,
    "data.loader": ("auto", *LOADERS),
    "data.blosc_codec": BLOSC_CODECS,
    "data.blosc_shuffle": BLOSC_SHUFFLES,
    "data.blosc_compress_at": BLOSC_COMPRESS_AT,
    "data.augment": AUGMENTS,
    "data.orient": ORIENTS,
    "data.rulebooks": RULEBOOKS,
    "train.optimizer": ("adam", "sgd"),
    "train.optimizer_impl": ("foreach", "for-loop", "fused"),
    "train.lr_scaling": ("none", "linear", "sqrt"),
    "train.grad_compression": COMPRESSIONS,
    "train.device": ("auto", "cpu", "cuda"),
    "train.amp": ("none", "bf16", "fp16"),
    "train.noise_scale": ("off", "auto", "ranks", "halves"),
    "dist.backend": BACKENDS,
}


MAX_PROCESSES = 256  #: loader processes per rank
#: the loader ``data.loader = auto`` gives each model: the one its ``input_kind`` needs
#: (``lartpc.train.parts.loader_mode``; ``tests/test_loader_processes.py`` checks the two agree)
AUTO_LOADER = {"scnet": "sparse", "jishnet": "blosc"}


def loader_of(cfg: Config) -> str:
    """The loader ``cfg`` trains with: ``data.loader``, ``auto`` resolved by model."""
    return AUTO_LOADER[cfg.model.name] if cfg.data.loader == "auto" else cfg.data.loader


def loader_processes_refusal(cfg: Config) -> str:
    """Why ``data.loader_processes`` cannot be used with ``cfg`` ("" if it can)."""
    n = cfg.data.loader_processes
    if n > MAX_PROCESSES:
        return f"must be at most {MAX_PROCESSES}"
    if loader_of(cfg) != "sparse":
        return (f"the processes make the sparse loader's batches (here data.loader = "
                f"{cfg.data.loader!r} with {cfg.model.name})")
    if cfg.data.prefetch_threads > 1:
        return (f"with data.prefetch_threads = {cfg.data.prefetch_threads}: one thread drives "
                "each process; set one of the two")
    if cfg.data.rulebooks == "loader" and cfg.model.sparse != "torch":
        return ("with data.rulebooks = loader and model.sparse = spconv: the processes build "
                "tables on the CPU, and spconv's rulebooks for a GPU are built on the GPU "
                "(use model.sparse = torch)")
    return ""


def table_cache_refusal(cfg: Config) -> str:
    """Why ``data.table_cache`` cannot be used with ``cfg`` ("" if it can): it keeps the
    index tables of SCNet's torch layers, which the sparse loader builds, per event."""
    if cfg.model.name != "scnet" or cfg.model.sparse != "torch":
        return (f"it keeps the index tables of SCNet's torch layers (here model.name = "
                f"{cfg.model.name}, model.sparse = {cfg.model.sparse})")
    if loader_of(cfg) != "sparse" or cfg.data.rulebooks == "forward":
        return ("the tables are the sparse loader's (data.loader = sparse, data.rulebooks = "
                f"loader or auto; here {cfg.data.loader}, {cfg.data.rulebooks})")
    if cfg.data.augment != "none":
        return (f"with data.augment = {cfg.data.augment}: an augmented event's coordinates, "
                "and so its tables, change every epoch")
    return ""


def choices(key: str, *, without: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The allowed values of setting ``key`` (``"model.name"``), less ``without``."""
    return tuple(v for v in CHOICES[key] if v not in without)


POSITIVE = ("data.downsample", "data.prefetch_threads", "train.batch_per_rank", "train.epochs",
            "train.time_limit_s", "train.budget_s", "train.lr", "train.eps",
            "train.eval_every_epochs", "train.log_flush_steps",
            "dist.timeout_s", "train.noise_every_steps")
NON_NEGATIVE = ("data.max_events", "data.prefetch", "data.loader_processes", "train.seed",
                "train.weight_decay", "train.momentum", "train.warmup_epochs",
                "train.checkpoint_every_steps", "train.eval_every_images", "train.eval_every_steps",
                "train.checkpoint_every_s", "train.threads", "train.progress_every_s")
MAX_THREADS = 1024  #: CPU threads per rank; beyond this torch fails to create them
#: Floats that must be finite (inf passes "> 0"; NaN fails every comparison anyway).
#: train.time_limit_s and train.budget_s may be inf: no limit.
FINITE = ("train.lr", "train.eps", "train.weight_decay", "train.momentum",
          "train.warmup_epochs", "train.checkpoint_every_s", "dist.timeout_s",
          "train.progress_every_s")


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("lartpc.configs").iterdir()
                  if p.name.endswith(".toml"))


def _presets_hint() -> str:
    return f"presets: {', '.join(preset_names())} (or give a .toml file)"


def _read_toml(name_or_file: str) -> tuple[dict, str]:
    path = Path(name_or_file)
    if path.suffix == ".toml" or path.exists():
        if path.is_dir():
            raise ConfigError(f"config {path}: is a folder, not a TOML config file; "
                              f"{_presets_hint()}")
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            text, origin = path.read_text(encoding="utf-8"), str(path)
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {path}: not UTF-8 text ({e.reason} at byte "
                              f"{e.start}); TOML files are UTF-8") from None
    else:
        res = resources.files("lartpc.configs") / f"{name_or_file}.toml"
        if not res.is_file():
            raise ConfigError(f"unknown config preset {name_or_file!r}; {_presets_hint()}")
        text, origin = res.read_text(), f"preset {name_or_file}"
    try:
        return tomllib.loads(text), origin
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{origin}: invalid TOML ({e})") from e
    except RecursionError:  # arrays or tables nested thousands deep
        raise ConfigError(f"{origin}: invalid TOML (nested too deeply)") from None


def _coerce(key: str, value, typ, origin: str):
    hint = typ if isinstance(typ, type) else typing.get_origin(typ)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is list and isinstance(value, list):
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{origin}: {key} = {value!r}: expected a list of numbers")
        return [float(v) for v in value]
    if not isinstance(value, hint) or (hint in (int, float) and isinstance(value, bool)):
        raise ConfigError(f"{origin}: {key} = {value!r} has type {type(value).__name__}, "
                          f"expected {hint.__name__}")
    return value


def _apply(cfg: Config, data: dict, origin: str) -> None:
    for section, values in data.items():
        if section not in Config.__dataclass_fields__:
            raise ConfigError(f"{origin}: unknown config section [{section}] "
                              f"(known: {', '.join(Config.__dataclass_fields__)})")
        if not isinstance(values, dict):
            raise ConfigError(f"{origin}: [{section}] must be a table")
        sub = getattr(cfg, section)
        hints = typing.get_type_hints(type(sub))
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(f"{origin}: unknown key {section}.{key} (known: "
                                  f"{', '.join(hints)})")
            setattr(sub, key, _coerce(f"{section}.{key}", value, hints[key], origin))


def parse_override(item: str) -> dict:
    """``"train.lr=0.002"`` -> ``{"train": {"lr": 0.002}}`` (value parsed as TOML, else str)."""
    if "=" not in item or "." not in item.split("=", 1)[0]:
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. train.epochs=3")
    key, raw = item.split("=", 1)
    section, name = key.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return {section: {name: value}}


def validate(cfg: Config) -> None:
    """Check choices and ranges that types alone cannot.

    Raises
    ------
    ConfigError
        Naming the first field out of range, e.g. ``train.eps = -1.0: must be > 0``.
    """
    d = cfg.to_dict()
    for key, allowed in CHOICES.items():
        s, k = key.split(".")
        if d[s][k] not in allowed:
            raise ConfigError(f"{key} = {d[s][k]!r}: expected one of {', '.join(allowed)}")
    for keys, ok, rule in ((POSITIVE, lambda v: v > 0, "must be > 0"),
                           (NON_NEGATIVE, lambda v: v >= 0, "must be >= 0"),
                           (FINITE, math.isfinite, "must be finite")):
        for key in keys:
            s, k = key.split(".")
            if not ok(d[s][k]):
                raise ConfigError(f"{key} = {d[s][k]!r}: {rule}")
    if not 0.0 < cfg.data.eval_fraction < 1.0:
        raise ConfigError(f"data.eval_fraction = {cfg.data.eval_fraction}: must be in (0, 1)")
    if not 0.0 <= cfg.data.test_fraction < 1.0 - cfg.data.eval_fraction:
        raise ConfigError(f"data.test_fraction = {cfg.data.test_fraction}: must be in [0, 1 - "
                          f"data.eval_fraction) = [0, {1.0 - cfg.data.eval_fraction:g})")
    if cfg.train.eval_every_images and cfg.train.eval_every_steps:
        raise ConfigError(f"train.eval_every_images = {cfg.train.eval_every_images} with "
                          f"train.eval_every_steps = {cfg.train.eval_every_steps}: set at "
                          "most one evaluation cadence (the other 0)")
    if cfg.data.orient != "none" and cfg.data.downsample != 1:
        raise ConfigError(f"data.orient = {cfg.data.orient!r} with data.downsample = "
                          f"{cfg.data.downsample}: finding the start needs full-resolution "
                          "events (data.downsample = 1)")
    if not 0 <= cfg.data.blosc_clevel <= 9:
        raise ConfigError(f"data.blosc_clevel = {cfg.data.blosc_clevel}: must be in 0..9")
    if cfg.data.prefetch_threads > 1 and loader_of(cfg) != "sparse":
        raise ConfigError(f"data.prefetch_threads = {cfg.data.prefetch_threads} with "
                          f"data.loader = {cfg.data.loader!r} and {cfg.model.name}: only the "
                          f"sparse loader prepares batches in several threads")
    if cfg.data.loader_processes:
        why = loader_processes_refusal(cfg)
        if why:
            raise ConfigError(f"data.loader_processes = {cfg.data.loader_processes}: {why}")
    if cfg.data.table_cache:
        why = table_cache_refusal(cfg)
        if why:
            raise ConfigError(f"data.table_cache = true: {why}")
    if cfg.data.prefetch_threads > MAX_THREADS:
        raise ConfigError(f"data.prefetch_threads = {cfg.data.prefetch_threads}: must be at "
                          f"most {MAX_THREADS}")
    # Ranges past which a run only fails later (Adam's decay overflowed float32 at 1e308;
    # torch crashed creating 100,000 threads).
    if cfg.train.weight_decay > 1.0:
        raise ConfigError(f"train.weight_decay = {cfg.train.weight_decay}: must be in [0, 1] "
                          "(the study uses 0.01)")
    if cfg.train.seed > MAX_SEED:
        raise ConfigError(f"train.seed = {cfg.train.seed}: must be at most 2**63 - 1")
    if cfg.train.threads > MAX_THREADS:
        raise ConfigError(f"train.threads = {cfg.train.threads}: must be at most "
                          f"{MAX_THREADS} (0 = the node's cores divided by its ranks)")
    betas = cfg.train.betas
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"train.betas = {betas}: expected two numbers in [0, 1)")
    kernel_settings.check(cfg.model.stem_kernel, cfg.model.stage2_kernel)
    why = cuda_graph_refusal(cfg)
    if why:
        raise ConfigError(f"train.cuda_graph=true: {why}")


def cuda_graph_refusal(cfg: Config) -> str | None:
    """Why the config cannot take ``train.cuda_graph`` (lartpc/train/graphed.py), or
    None: it needs JishNet, or SCNet's torch layers (spconv waits for the device inside
    its step); float32, or for JishNet bfloat16 too (SCNet's float16 trunk and
    float16's loss scale are not captured); for JishNet no ``train.compile`` (the graph
    replays the plain model); not Horovod (its gradient exchange hooks into the
    backward; the backend a launcher gives is checked when training starts)."""
    if not cfg.train.cuda_graph:
        return None
    name = cfg.model.name
    if name == "scnet" and cfg.model.sparse != "torch":
        return ("it needs model.name=jishnet, or scnet with model.sparse=torch (here scnet, "
                f"model.sparse={cfg.model.sparse})")
    amps = ("none", "bf16") if name == "jishnet" else ("none",)
    if cfg.train.amp not in amps:
        return f"it needs train.amp={' or '.join(amps)} with {name} (here {cfg.train.amp})"
    if cfg.train.compile and name == "jishnet":  # (compile leaves SCNet as it is)
        return "it needs train.compile=false (the graph replays the model uncompiled)"
    return cuda_graph_backend_refusal(cfg.dist.backend)


def cuda_graph_backend_refusal(backend: str, here: str | None = None) -> str | None:
    """Why ``train.cuda_graph`` cannot run under ``backend`` (the config's, or the one a
    launcher gave), or None; ``here`` says what the message names (the backend)."""
    if backend != "horovod":
        return None
    return (f"it needs dist.backend=torch or none (here {here or backend}): Horovod's "
            "gradient exchange hooks into the backward, which a replay does not run")


def config_from_dict(data: dict, origin: str) -> Config:
    """The config a run recorded (``Config.to_dict()`` in run.json or a checkpoint);
    keys it lacks keep their defaults, ``origin`` names the source in errors."""
    cfg = Config()
    _apply(cfg, data, origin)
    validate(cfg)
    return cfg


def load_config(name_or_file: str, overrides: list[str] | None = None) -> Config:
    """Resolve a preset name or TOML file plus ``section.key=value`` overrides."""
    cfg = Config()
    data, origin = _read_toml(name_or_file)
    _apply(cfg, data, origin)
    for item in overrides or []:
        _apply(cfg, parse_override(item), f"--set {item}")
    validate(cfg)
    return cfg


