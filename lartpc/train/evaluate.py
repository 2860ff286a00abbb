"""Evaluation over the held-out events: each seen exactly once across ranks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lartpc import CLASSES
from lartpc.dist import World


@dataclass
class EvalResult:
    loss: float
    n_events: int
    confusion: np.ndarray  # (k, k) int counts, rows true, k = len(classes)
    classes: tuple[str, ...] = CLASSES  # the store's classes

    def row(self) -> dict:
        """The ``eval.csv`` row: loss, accuracy, events and ``acc_<class>``, the share of
        the class's events called right; nan for a class with no events here (0 of 0
        is no accuracy, not 0 %: a store of some classes names all five)."""
        correct, total = np.diag(self.confusion), self.confusion.sum(1)
        per_class = np.divide(correct, total, out=np.full(len(total), np.nan), where=total > 0)
        return {"loss": self.loss, "accuracy": float(correct.sum() / max(self.n_events, 1)),
                "n_events": self.n_events,
                **{f"acc_{c}": float(a) for c, a in zip(self.classes, per_class, strict=True)}}


@torch.no_grad()
def evaluate(model, loader, world: World, loss_fn, autocast,
             classes: tuple[str, ...] = CLASSES) -> EvalResult:
    """Loss (event-weighted mean) and confusion matrix summed over all ranks, over the
    store's ``classes``.

    ``loader`` is None on a rank without held-out events. Ranks may hold different
    numbers of them; the only
    collective comes after the loop, so unequal step counts cannot deadlock.
    """
    was_training = model.training
    model.eval()
    loss_sum = 0.0
    k = len(classes)
    conf = torch.zeros(k, k, dtype=torch.float64)
    for batch in (loader if loader is not None else ()):
        with autocast():
            logits = model(batch).float()
        loss_sum += float(loss_fn(logits, batch.labels)) * batch.data_size
        pred = logits.argmax(1).cpu()
        idx = batch.labels.cpu() * k + pred
        conf += torch.bincount(idx, minlength=k ** 2).view(k, -1)
    totals = world.allreduce_sum(torch.cat([conf.flatten(), torch.tensor([loss_sum])]))
    conf = totals[:-1].view(k, k).round().to(torch.int64).numpy()
    n = int(conf.sum())
    model.train(was_training)
    return EvalResult(loss=float(totals[-1]) / max(n, 1), n_events=n, confusion=conf,
                      classes=tuple(classes))


@dataclass
class Predictions:
    """A network's call on some events: store ``positions``, the events' indices in
    the dataset they were generated for (``event_ids``; the store indices when the
    store is the run's own), true and predicted classes, truth directions (n, 3)."""

    positions: np.ndarray
    event_ids: np.ndarray
    labels: np.ndarray
    predicted: np.ndarray
    directions: np.ndarray
    classes: tuple[str, ...] = CLASSES  #: the store's classes

    def confusion(self) -> np.ndarray:
        """(k, k) counts over :attr:`classes`, rows true, columns predicted."""
        k = len(self.classes)
        conf = np.zeros((k, k), np.int64)
        np.add.at(conf, (self.labels, self.predicted), 1)
        return conf


SPLITS = ("validation", "test")  #: the held-out parts of a run's events


def held_out(cfg, labels: np.ndarray, split: str = "validation") -> np.ndarray:
    """The store indices a run of config ``cfg`` (a :class:`lartpc.config.Config`)
    held out of a store whose events have ``labels``: its ``validation`` events (those
    its ``eval.csv`` and ``confusion.csv`` were measured on) or its ``test`` events
    (``data.test_fraction``: never trained on nor scored during training).

    Raises
    ------
    LartpcError
        For the test split of a run that has none.
    """
    from lartpc.data.sharding import split_three
    from lartpc.errors import LartpcError

    if split not in SPLITS:
        raise LartpcError(f"--split {split!r}: one of {', '.join(SPLITS)}")
    if split == "test" and not cfg.data.test_fraction:
        raise LartpcError("--split test: the run has no test split (data.test_fraction = 0: "
                          "its held-out events are its validation events)")
    n = min(len(labels), cfg.data.max_events) if cfg.data.max_events else len(labels)
    parts = split_three(n, cfg.data.eval_fraction, cfg.data.test_fraction, cfg.train.seed,
                        np.asarray(labels[:n]))
    return parts[1] if split == "validation" else parts[2]


#: how a network's events were made beyond seed, count, geometry and downsample, where
#: not ``lartpc simulate``'s defaults (``events`` of :mod:`lartpc.train.weights`); a
#: record without ``physics`` was made with sim3 (:data:`lartpc.sim.versions.UNRECORDED`)
GENERATION = ("classes", "momentum_gev", "dead_wire_fraction", "physics")


def generated_labels(n_events: int, classes: str | None = None) -> np.ndarray:
    """The labels of a ``lartpc simulate`` store of ``n_events`` made with ``classes``
    (comma-separated names, cycled: :func:`lartpc.sim.generate.simulate_event`; default
    all five), known without generating it."""
    from lartpc.sim.generate import parse_classes

    codes = np.array([CLASSES.index(c) for c in parse_classes(classes)])
    return codes[np.arange(n_events) % len(codes)]


def regenerate_held_out(network: dict, out, workers: int = 1,
                        split: str = "validation", overwrite: bool = False) -> np.ndarray:
    """Generate the held-out events (its ``split``: :func:`held_out`) of ``network`` (see
    :func:`lartpc.train.weights.load`) alone into a store at ``out``, from its record of
    how its events were made (``events``: seed, count, geometry, downsample; and where
    ``lartpc simulate``'s defaults were not used, classes, momentum_gev and
    dead_wire_fraction; and the generator's physics version, sim3 where it names none);
    returns their indices in the full dataset. Shards already in
    ``out`` are replaced only with ``overwrite``.

    Raises
    ------
    LartpcError
        When the network does not record how its events were made.
    """
    from pathlib import Path

    from lartpc.config import config_from_dict
    from lartpc.errors import LartpcError
    from lartpc.sim.subset import write_events

    ev = network.get("events") or {}
    missing = [k for k in ("seed", "events", "geometry", "downsample") if k not in ev]
    if missing:
        run = Path(str(network.get("path"))).parent
        raise LartpcError(f"{network.get('path')}: does not record how its events were made "
                          f"({', '.join(missing)} missing); give the run's store (--store), "
                          "or write weights that record it: python -m "
                          f"lartpc.jobs.local.compact_weights {run} --store STORE")
    cfg = config_from_dict(network["config"], str(network.get("path")))
    from lartpc.sim.versions import UNRECORDED

    made = {"physics": UNRECORDED, **{k: ev[k] for k in GENERATION if k in ev}}
    indices = held_out(cfg, generated_labels(int(ev["events"]), made.get("classes")), split)
    write_events(out, indices, seed=int(ev["seed"]), source_geometry=str(ev["geometry"]),
                 downsample=int(ev["downsample"]), workers=workers, overwrite=overwrite,
                 **made)
    return indices


@torch.no_grad()
def predict(network: dict, store, positions: np.ndarray | None = None, *,
            orient: str | None = None, threads: int = 1,
            split: str = "validation", sparse: str | None = None) -> Predictions:
    """Classify events of ``store`` (an EventStore) with ``network`` (see
    :func:`lartpc.train.weights.load`) on the CPU, each once.

    ``positions`` are store indices (None: the run's held-out events of ``split``, the
    store being the one it was trained on, which is checked when the network records
    it); ``orient`` replaces the run's ``data.orient`` and ``sparse`` its
    ``model.sparse`` (None: keep them).

    Raises
    ------
    LartpcError
        When the store is not the run's own (positions None) or the weights do not fit.
    """
    from lartpc.config import config_from_dict
    from lartpc.errors import LartpcError
    from lartpc.models import build
    from lartpc.train.parts import loader_mode, make_loader, model_options
    from lartpc.train.segments import store_identity

    where = str(network.get("path"))
    cfg = config_from_dict(network["config"], where)
    if orient is not None:
        cfg.data.orient = orient
    if sparse is not None:
        cfg.model.sparse = sparse
    if positions is None:
        trained_on = network.get("store")
        if trained_on and store_identity(store, cfg.data.max_events) != trained_on:
            raise LartpcError(f"{store.paths[0].parent}: not the events {where} was trained "
                              "on (their count and labels differ); give the run's own store")
        positions = held_out(cfg, store.labels, split)
    positions = np.asarray(positions, np.int64)
    if len(positions) == 0 or positions.min() < 0 or positions.max() >= len(store):
        raise LartpcError(f"--indices: store indices 0..{len(store) - 1}, one or more")
    torch.set_num_threads(threads)
    device = torch.device("cpu")
    model = build(cfg.model.name, image_size=store.geometry.shape,
                  num_classes=len(store.classes), **model_options(cfg, device.type))
    try:
        model.load_state_dict(network["model"])
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise LartpcError(f"{where}: its weights do not fit these events' model ({first}); "
                          "same data.downsample needed") from None
    model.eval()
    # the model given: the torch layers' tables are built in the loader's thread
    loader = make_loader(cfg, store, loader_mode(cfg, model), positions, device, train=False,
                         model=model)
    pos, preds, dirs = [], [], []
    for batch in loader:
        preds.append(model(batch).float().argmax(1).numpy())
        pos.append(np.asarray(batch.event_ids, np.int64))
        dirs.append(np.asarray(batch.truth["direction"], float))
    pos = np.concatenate(pos)
    return Predictions(positions=pos, event_ids=event_ids(store)[pos],
                       labels=np.asarray(store.labels)[pos].astype(np.int64),
                       predicted=np.concatenate(preds).astype(np.int64),
                       directions=np.concatenate(dirs), classes=store.classes)


def event_ids(store) -> np.ndarray:
    """Each event's index in the dataset it was generated for (the store's
    ``event_id``; a store without it: the store indices)."""
    import h5py

    parts = []
    for path in store.paths:
        with h5py.File(path, "r") as f:
            n = len(f["label"])
            parts.append(f["event_id"][:] if "event_id" in f else np.full(n, -1))
    ids = np.concatenate(parts).astype(np.int64)
    return ids if (ids >= 0).all() else np.arange(len(ids), dtype=np.int64)
