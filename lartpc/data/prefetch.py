"""Run a producer one or more steps ahead of its consumer, in background threads.

Order is preserved and nothing is dropped: with one thread, it calls ``produce(k)`` for
``k = 0 .. n-1`` in turn and hands the results over a bounded FIFO; with ``workers``
threads, thread ``j`` makes items ``j, j + workers, ...`` into a FIFO of its own and the
consumer takes them round the threads, so the order is the same. An exception in
``produce`` is re-raised in the consumer at the position of the item that failed.

Buffer reuse contract: while the consumer holds item ``k`` the producers can be
working on at most item ``k + workers * (depth + 1)``; so a producer that writes into
``slots = workers * (depth + 1) + 1`` rotating buffers (item ``k`` into ``k % slots``;
``depth + 2`` for one thread) never overwrites an item the consumer still holds.
:func:`n_slots` gives that number.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


def n_slots(depth: int, workers: int = 1) -> int:
    """Rotating buffers a producer needs under :func:`prefetch` with ``depth`` and
    ``workers``."""
    return max(workers, 1) * (max(depth, 0) + 1) + 1


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


def prefetch(produce: Callable[[int], T], n: int, depth: int = 1,
             name: str = "prefetch", workers: int = 1,
             stop: threading.Event | None = None) -> Iterator[T]:
    """Yield ``produce(0) .. produce(n-1)`` in order, computed ``depth`` items ahead
    by each of ``workers`` threads.

    Parameters
    ----------
    produce : called with the item number, in increasing order within each thread;
        with several workers, from several threads at once (it must allow that).
    n : number of items.
    depth : items each thread keeps ready beyond the one the consumer holds; 0 runs
        inline (in the consumer's thread, whatever ``workers``).
    name : thread name (shows in stack dumps; ``-j`` appended for worker j of several).
    workers : threads producing items, each every ``workers``-th one.
    stop : set here once the consumer is done (finished, failed or closed early), before
        the threads are joined: a ``produce`` that waits on something watches it to give
        up waiting (the join has no time limit). Made here when not given.
    """
    if depth <= 0:
        for k in range(n):
            yield produce(k)
        return
    workers = max(1, min(workers, n))
    ready = [queue.Queue(maxsize=depth) for _ in range(workers)]
    stop = threading.Event() if stop is None else stop

    def put(fifo: queue.Queue, item) -> bool:
        while not stop.is_set():
            try:
                fifo.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work(j: int) -> None:
        try:
            for k in range(j, n, workers):
                if stop.is_set() or not put(ready[j], produce(k)):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            put(ready[j], _Failure(e))
            return
        put(ready[j], _DONE)

    threads = [threading.Thread(target=work, args=(j,), daemon=True,
                                name=name if workers == 1 else f"{name}-{j}")
               for j in range(workers)]
    for thread in threads:
        thread.start()
    try:
        for k in range(n + 1):  # at k == n: the end mark of the thread that would make it
            item = ready[k % workers].get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:  # consumer finished, failed or stopped early: release the threads
        stop.set()
        for thread in threads:
            thread.join()
