"""A training step's forward, loss and backward replayed as one CUDA graph
(``train.cuda_graph``): SCNet's with its torch layers (issue 36) and JishNet's (issue
35, :class:`DenseGraphedStep`, below).

At the paper's minibatch of 7 SCNet's step is host-bound on a GPU: its kernels take
~1.5 ms of a step the host needs several times as long to launch. The torch layers
(``model.sparse = torch``) read nothing back in the step, so with the batch's index
tables padded to fixed sizes (:func:`~lartpc.models.sparse_torch.pad_maps`: the same
outputs and gradients) the forward, the loss and the backward can be captured once and
replayed: the host then launches a handful of copies and one graph per step; the
step's loss and accuracy for the read-back are computed in the graph too. The
optimizer step stays outside the graph (its learning rate changes with the schedule),
as do evaluation, the loss's read-back and the stop vote.

Sizes: :class:`Capacities` holds the padded row counts per level, a level's grown
(never shrunk) to 1.25x a batch's that does not fit it, rounded up to 32 rows. Only the
step grows them, in step order, so a step's padded sizes depend on the batches before
it alone (not on how far the loader's thread had got), and a checkpoint keeps them: a
run and its resumed segments pad every step alike. The sparse loader pads each training
batch's tables in its prefetch thread to the sizes it finds; the step pads again where
they have grown since (or the batch did not fit), and captures a new graph when they
grew (a handful of times a run).

What replays: every tensor the captured kernels read is a static buffer of the graph;
each step copies its batch's features, labels and tables into them (about fifteen
device copies), replays, and points every parameter's ``.grad`` at the graph's gradient
buffers for the optimizer. A step the graph cannot take (a batch
of another size than ``train.batch_per_rank``, such as an epoch's short last one; a
batch whose pooling left no site; a noise-scale step) runs eagerly. On a CPU there is
no graph: the same padded static step runs eagerly, writing logits, loss and
gradients into the same tensors every step as a replay does (what the tests check
against the unpadded step); it is no faster there.

Several ranks (the torch backend): a replay runs none of DDP's gradient hooks, so with
the option every step but a noise-scale one runs the plain model and the trainer
averages its gradients after the backward (:meth:`World.average_gradients
<lartpc.dist.world.World.average_gradients>`, DDP's arithmetic); Horovod is refused.

JishNet: its step has fixed shapes and reads nothing back (the fused stages' Triton
kernels included), so nothing is padded. The device-dense loader writes its batches
into a few buffers in turn; each of them gets a graph of its own that reads the images
where they lie, so a step copies only its labels before the replay (other images are
copied into one buffer of the step's own; :class:`DenseGraphedStep`). Under
``train.amp = bf16`` the
graph's autocast does not cache its casts of the weights (a capture cannot hold that
cache); the casts are the same, so the numbers are. On a GPU the graph takes away the
host's time launching the step's kernels (``lartpc bench model --model jishnet
--cuda-graph`` measures how much that is); the kernels themselves are unchanged.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import torch

from lartpc.models import sparse_torch
from lartpc.models.table_graph import CAPTURE_LOCK
from lartpc.train.padding import Capacities, graphable
from lartpc.train.readback import step_values

log = logging.getLogger(__name__)

def check_graphable(cfg, world) -> None:
    """Raise ConfigError where ``train.cuda_graph`` cannot run: the config's own rules
    (:func:`~lartpc.config.cuda_graph_refusal`), then the backend the launcher gave:
    one rank, or ranks of the torch backend (whose exchange the trainer makes after a
    replay, :meth:`~lartpc.dist.world.World.average_gradients`); not Horovod's, whose
    hooks would run inside the capture."""
    from lartpc.config import cuda_graph_backend_refusal, cuda_graph_refusal
    from lartpc.errors import ConfigError

    why = cuda_graph_refusal(cfg) or cuda_graph_backend_refusal(
        world.backend, f"{world.size} rank(s), {world.backend}")
    if why:
        raise ConfigError(f"train.cuda_graph=true: {why}")


def _inputs(maps) -> list[torch.Tensor]:
    """The tensors of padded tables that the step reads (not the coordinates or the
    keys, which it does not)."""
    out = [maps.order, maps.dense_index]
    for level in maps.levels:
        out += [level.neighbours, level.slots]
        out += [] if level.mirrored is None else [level.mirrored]
    return out


class StaticStep:
    """What both graphed steps share: forward, loss and backward on static buffers,
    captured as a CUDA graph on a CUDA device (``capture``) and replayed, run eagerly
    on the same buffers otherwise; a capture that fails leaves the rest of the segment
    to the eager step. A subclass loads each batch into the buffers and says what the
    forward is (``_logits``)."""

    #: the training loader's padding (SCNet's tables; None: nothing to pad)
    caps: Capacities | None = None
    #: the forward's and the loss's autocast (a factory of contexts)
    autocast = nullcontext

    def __init__(self, model: torch.nn.Module, loss_fn, minibatch: int, capture: bool,
                 warmup: int = 3):
        self.model, self.loss_fn = model, loss_fn
        self.minibatch = minibatch
        self.capture, self.warmup = capture, warmup
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.key: tuple | None = None  # what the buffers were made for
        self.graph: torch.cuda.CUDAGraph | None = None
        #: without a graph: the "replayed" outputs of these buffers (none yet: [])
        self._outputs: list[torch.Tensor] = []
        #: static steps taken, graphs captured and replayed, buffer sets made (one per
        #: new padded size), steps left to the eager step, why capturing stopped
        self.stats = {"steps": 0, "captures": 0, "replays": 0, "resized": 0,
                      "eager_steps": 0, "fallback": None}

    def _logits(self) -> torch.Tensor:
        raise NotImplementedError

    def _replay(self):
        """The step on the buffers as loaded: (logits, loss), the gradients in
        ``.grad``."""
        self.stats["steps"] += 1
        if self.graph is not None:
            self.graph.replay()
            self.stats["replays"] += 1
        else:
            self._replay_eagerly()
        for p, g in zip(self.params, self.grads, strict=True):
            p.grad = g  # the graph's buffers (an eager step in between replaced them)
        return self.logits, self.loss

    def _replay_eagerly(self) -> None:
        """Without a graph (a CPU), what a replay does: the step computed afresh, its
        logits, loss and gradients written into the same output tensors every step, so
        that a caller holding one past the next step sees it overwritten, as on a GPU."""
        for p in self.params:
            p.grad = None
        self._forward_backward()
        out = [self.logits.detach(), self.loss.detach(), self.values,
               *(p.grad for p in self.params)]
        if not self._outputs:  # the first step on these buffers
            self._outputs = [t.clone() for t in out]
        else:
            for mine, now in zip(self._outputs, out, strict=True):
                mine.copy_(now)
        self.logits, self.loss, self.values, *self.grads = self._outputs

    def _eager_step(self):
        self.stats["eager_steps"] += 1
        return None

    def settled(self, batch):
        """``batch`` for a step the graph leaves to the eager step (a short batch, a
        noise-scale step): its tables padded to the capacities as they stand now. The
        loader's threads pad to the capacities as they stood when each batch was built,
        which depends on timing; the capacities at a step do not (only the step grows
        them), so the eager step's sums run over the same rows in every run, as the
        static step's do."""
        if self.caps is None or not isinstance(batch.rulebooks, sparse_torch.SiteMaps):
            return batch
        return replace(batch, rulebooks=self.caps.pad(batch.rulebooks, grow=False))

    def _forward_backward(self) -> None:
        with self.autocast():  # as the eager step (lartpc.train.noise.forward_backward)
            self.logits = self._logits()
            self.loss = self.loss_fn(self.logits.float(), self.labels)
        self.loss.backward()
        self.values = step_values(self.loss, self.logits, self.labels)

    def _renew(self, key: tuple) -> None:
        """New buffers for ``key`` follow (the subclass makes them): the old graph, its
        memory pool and its outputs go."""
        self.graph = None
        self.key = key
        self._outputs = []
        self.stats["resized"] += 1

    def _drop_graphs(self) -> None:
        """Every graph this step holds goes, with its memory pool (a failed capture:
        the segment steps eagerly on the memory they held)."""
        self.graph, self.key = None, None

    def _try_capture(self) -> bool:
        """On CUDA, the graph of the step on the new buffers; False when the capture
        failed (this segment then steps eagerly)."""
        if not self.capture:
            return True
        try:
            self._capture()
        except RuntimeError as e:  # something in the step cannot be captured
            self._drop_graphs()
            for p in self.params:
                p.grad = None
            self.stats["fallback"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            log.warning("train.cuda_graph: the capture failed (%s); the rest of this "
                        "segment steps eagerly", self.stats["fallback"])
            return False
        return True

    def _capture(self) -> None:
        """Warm up on a side stream (as torch asks), then capture forward, loss and
        backward with the gradients as the graph's own buffers; never while the loader's
        thread captures its tables' graph (``table_graph.CAPTURE_LOCK``)."""
        with CAPTURE_LOCK:
            self._capture_now()

    def _capture_now(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                for p in self.params:
                    p.grad = None
                self._forward_backward()
        torch.cuda.current_stream().wait_stream(side)
        for p in self.params:
            p.grad = None
        graph = torch.cuda.CUDAGraph()
        # thread_local: the loader's thread keeps building tables (reading counts back)
        # on its own stream while this one captures; only this thread's calls are checked
        with stale_streams_redirected(), \
                torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._forward_backward()
        self.grads = [p.grad for p in self.params]
        self.graph = graph
        self.stats["captures"] += 1
        log.info("train.cuda_graph: captured for %s", self.key)


class GraphedStep(StaticStep):
    """Forward, loss and backward of an SCNet with the torch layers on padded tables
    (:class:`StaticStep`).

    ``__call__(batch)`` returns (logits, loss) with the gradients in ``.grad``, or None
    when this batch needs the eager step (the caller runs it); ``values`` then holds the
    step's (loss, accuracy) (:func:`~lartpc.train.readback.step_values`), computed in
    the graph: the step's thread launches nothing for them.
    """

    def __init__(self, model: torch.nn.Module, loss_fn, capacities: Capacities,
                 minibatch: int, capture: bool, warmup: int = 3):
        super().__init__(model, loss_fn, minibatch, capture, warmup)
        self.caps = capacities

    def __call__(self, batch):
        if self.stats["fallback"] or batch.data_size != self.minibatch:
            return self._eager_step()  # a short last batch of an epoch, say
        maps = batch.rulebooks
        if not isinstance(maps, sparse_torch.SiteMaps) or not maps.fits(
                batch.coords, batch.data_size, batch.shape, True):
            maps = self.model.rulebook_builder(training=True)(batch.coords, batch.data_size)
        maps = self.caps.pad(maps)
        if not graphable(maps):
            return self._eager_step()
        key = sparse_torch.sizes(maps)
        if key != self.key:
            if not self._allocate(key, batch, maps):
                return self._eager_step()
        else:
            self._load(batch, maps)
        return self._replay()

    def _logits(self) -> torch.Tensor:
        return self.model.forward_tables(self.features, self.maps, self.batch_size)

    def _load(self, batch, maps) -> None:
        """This batch into the static buffers: one multi-tensor copy of the labels,
        features and tables (on a GPU a launch or two for the ~15 tensors, each of
        which is otherwise an operation of the step's thread), then the features' rows
        past this batch's set to zero."""
        n = len(batch.features)
        torch._foreach_copy_([self.labels, self.features[:n], *_inputs(self.maps)],
                             [batch.labels, batch.features, *_inputs(maps)],
                             non_blocking=True)
        self.features[n:].zero_()

    def _allocate(self, key: tuple, batch, maps) -> bool:
        """Static buffers for padded sizes ``key`` (this batch's copies) and, on CUDA,
        the graph; False when the capture failed."""
        self._renew(key)
        self.batch_size = batch.data_size
        rows = len(maps.order)
        self.features = batch.features.new_zeros(rows, batch.features.shape[1])
        self.features[:len(batch.features)].copy_(batch.features)
        self.labels = batch.labels.clone()
        self.maps = replace(  # copies of the tensors the step reads (_inputs)
            maps, order=maps.order.clone(), dense_index=maps.dense_index.clone(),
            levels=[replace(lv, neighbours=lv.neighbours.clone(), slots=lv.slots.clone(),
                            mirrored=None if lv.mirrored is None else lv.mirrored.clone())
                    for lv in maps.levels], held=None)
        return self._try_capture()


@contextmanager
def stale_streams_redirected():
    """While capturing, autograd runs a node that holds a stream outside the capture on
    the capturing one instead. DDP keeps every parameter's gradient-accumulation node,
    made on the default stream when it wrapped the model: with several ranks a capture
    on torch's side stream finds them stale, and torch refuses it (the default stream
    would join the graph), so the segment stepped eagerly. torch's switch for this
    (``torch.autograd.graph.set_override_stale_capture_stream``, in releases since
    spring 2026) is on for the capture alone; a torch without it is left as it is (the
    capture may fail and fall back, as before). Inferred from torch's documentation;
    not yet run on GPUs with several ranks."""
    switch = getattr(torch.autograd.graph, "set_override_stale_capture_stream", None)
    state = getattr(torch._C, "_override_stale_capture_stream", None)
    if switch is None or state is None:
        yield
        return
    before = bool(state())
    switch(True)
    try:
        yield
    finally:
        switch(before)


#: JishNet's graphs: at most this many input buffers get a graph that reads each where
#: it lies (the device-dense loader rewrites 4 in turn in training, data.prefetch=2); a
#: batch in another one, or one not in a reused buffer, is copied into the step's own
MAX_BUFFERS = 4
#: what a graph of JishNet's step holds (kept per input buffer)
_GRAPH_STATE = ("x", "graph", "grads", "logits", "loss", "values", "_outputs")


class DenseGraphedStep(StaticStep):
    """JishNet's forward (under ``autocast``), loss and backward on the minibatch's images
    (issue 35): its shapes are fixed and it reads nothing back, so nothing needs
    padding. ``__call__`` as :class:`GraphedStep`'s. ``autocast`` must not cache its
    casts (a capture cannot hold them: ``cache_enabled=False``).

    The images: a batch whose ``dense`` is one of the loader's reused buffers
    (``Batch.dense_reused``: the device-dense loader's, 4 in training by default) is read
    where it lies, by a graph of that buffer's own (up to :data:`MAX_BUFFERS`), so a
    step copies only its labels; any other is copied into the step's own buffer (one
    copy of the minibatch, 363 MB at 3600², before the replay). Each graph has its own
    memory pool: 4 graphs hold about 4 times one step's activations.
    """

    def __init__(self, model: torch.nn.Module, loss_fn, minibatch: int, capture: bool,
                 autocast=nullcontext, warmup: int = 3):
        super().__init__(model, loss_fn, minibatch, capture, warmup)
        self.autocast = autocast
        self.labels: torch.Tensor | None = None  # one static buffer, read by every graph
        self._graphs: dict[tuple, dict] = {}  # the state of each graph but the current

    def _drop_graphs(self) -> None:
        super()._drop_graphs()
        self._graphs.clear()  # the other buffers' graphs, each with a step's activations

    def __call__(self, batch):
        x = batch.dense
        if self.stats["fallback"] or batch.data_size != self.minibatch or x is None:
            return self._eager_step()
        key = ("reused", x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device)
        known = key == self.key or key in self._graphs
        if not batch.dense_reused or (not known and self._reused() >= MAX_BUFFERS):
            key = ("copy", tuple(x.shape), x.dtype, x.device)
        if self.labels is None:
            self.labels = batch.labels.clone()
        else:
            self.labels.copy_(batch.labels, non_blocking=True)
        if key != self.key and not self._switch(key, x):
            return self._eager_step()
        if key[0] == "copy":
            self.x.copy_(x, non_blocking=True)
        return self._replay()

    def _reused(self) -> int:
        """Graphs made for reused buffers of the loader."""
        return sum(k is not None and k[0] == "reused" for k in (self.key, *self._graphs))

    def _switch(self, key: tuple, x: torch.Tensor) -> bool:
        """Make ``key``'s graph the current one: one made before, or a new one for
        ``x`` (the loader's buffer itself, or a copy); False when its capture failed."""
        if self.key is not None:
            self._graphs[self.key] = {a: getattr(self, a, None) for a in _GRAPH_STATE}
        known = self._graphs.pop(key, None)
        if known is not None:
            for a, v in known.items():
                setattr(self, a, v)
            self.key = key
            return True
        self._renew(key)
        self.x = x if key[0] == "reused" else x.clone()
        return self._try_capture()

    def _logits(self) -> torch.Tensor:
        return self.model.forward_tensor(self.x)


def from_config(cfg, world, model: torch.nn.Module, loss_fn,
                resume: dict | None = None) -> StaticStep | None:
    """The graphed step ``train.cuda_graph`` asks for (None when it does not), its
    checks passed (:func:`check_graphable`): JishNet's (:class:`DenseGraphedStep`) or
    SCNet's (:class:`GraphedStep`, a resumed run's padded sizes restored; its ``caps``
    go to the training loader)."""
    if not cfg.train.cuda_graph:
        return None
    check_graphable(cfg, world)
    cuda = world.device.type == "cuda"
    if not cuda:
        log.warning("train.cuda_graph on %s: no graph is captured there; the static step "
                    "runs eagerly (for testing, no faster)", world.device.type)
    minibatch = cfg.train.batch_per_rank
    if model.input_kind == "dense":
        from lartpc.train.parts import autocast_and_scaler

        autocast, _ = autocast_and_scaler(cfg, world.device.type, cache=False)
        return DenseGraphedStep(model, loss_fn, minibatch, capture=cuda, autocast=autocast)
    caps = Capacities()
    if resume is not None and resume.get("padded_sizes"):
        caps.rows = tuple(resume["padded_sizes"])  # pad as the run before did
    return GraphedStep(model, loss_fn, caps, minibatch, capture=cuda)
