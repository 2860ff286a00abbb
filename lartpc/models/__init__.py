"""Model registry: ``build(name, image_size=..., **options)``.

Every model takes a :class:`~lartpc.data.batch.Batch` and returns logits (B, 5); its
``input_kind`` attribute (``"dense"`` or ``"sparse"``) tells the loader what to fill.
"""

from __future__ import annotations

import importlib
import inspect

from lartpc.errors import ConfigError

#: name -> (module, class)
MODELS: dict[str, tuple[str, str]] = {
    "jishnet": ("lartpc.models.jishnet", "JishNet"),
    "scnet": ("lartpc.models.scnet", "SCNet"),
}
#: The models' own options (config's model.* settings take their allowed values from here).
LOSSES = ("ce", "paper")  #: lartpc/models/losses.py (its MODULES, in this order)
HEADS = ("flatten", "max")  #: lartpc/models/head.py
STEMS = ("auto", "fused", "library")  #: JishNet's first stage (lartpc/models/jishnet.py)
STAGE2S = ("auto", "fused", "library")  #: JishNet's second stage (same file)
ALGOS = ("auto", "native", "implicit_gemm", "split_implicit_gemm")  #: spconv (scnet.py)
SPARSE = ("spconv", "torch")  #: who runs SCNet's sparse layers (lartpc/models/scnet.py)


def image_hw(image_size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """(H, W) from an int (square) or a pair."""
    if isinstance(image_size, int):
        hw = (image_size, image_size)
    else:
        hw = tuple(int(s) for s in image_size)
    if len(hw) != 2 or min(hw) < 1:
        raise ConfigError(f"image_size={image_size!r}: expected a positive int or (H, W)")
    return hw  # type: ignore[return-value]


def model_class(name: str) -> type:
    """The class registered as ``name`` (imports its module only then)."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
    module, cls = MODELS[name]
    return getattr(importlib.import_module(module), cls)


def build(name: str, image_size: int | tuple[int, int] = 3600, **options):
    """Build model ``name`` for images of ``image_size``.

    Parameters
    ----------
    name : ``jishnet`` or ``scnet``.
    image_size : side of a square image, or (H, W).
    **options : model-specific speed options (see each class); unknown ones are an error.

    Returns
    -------
    torch.nn.Module returning logits (B, 5) for a Batch.
    """
    cls = model_class(name)
    accepted = [p for p in inspect.signature(cls.__init__).parameters
                if p not in ("self", "image_size")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(f"model {name!r}: unknown option(s) {', '.join(unknown)} "
                          f"(accepted: {', '.join(accepted) or 'none'})")
    return cls(image_hw(image_size), **options)


def num_parameters(model) -> int:
    """Trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
