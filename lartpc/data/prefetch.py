"""Run a producer one or more steps ahead of its consumer, in a background thread.

Order is preserved and nothing is dropped: the thread calls ``produce(k)`` for
``k = 0 .. n-1`` in turn and hands the results over a bounded FIFO. An exception in
``produce`` is re-raised in the consumer at the position of the item that failed.

Buffer reuse contract: while the consumer holds item ``k`` the producer can be
working on at most item ``k + depth + 1``; so a producer that writes into
``slots = depth + 2`` rotating buffers (item ``k`` into ``k % slots``) never
overwrites an item the consumer still holds. :func:`n_slots` gives that number.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


def n_slots(depth: int) -> int:
    """Rotating buffers a producer needs under :func:`prefetch` with ``depth``."""
    return max(depth, 0) + 2


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


def prefetch(produce: Callable[[int], T], n: int, depth: int = 1,
             name: str = "prefetch") -> Iterator[T]:
    """Yield ``produce(0) .. produce(n-1)`` in order, computed ``depth`` items ahead.

    Parameters
    ----------
    produce : called with the item number, in increasing order, from one thread.
    n : number of items.
    depth : items kept ready beyond the one the consumer holds; 0 runs inline.
    name : thread name (shows in stack dumps).
    """
    if depth <= 0:
        for k in range(n):
            yield produce(k)
        return
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for k in range(n):
                if stop.is_set() or not put(produce(k)):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            put(_Failure(e))
            return
        put(_DONE)

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:  # consumer finished, failed or stopped early: release the thread
        stop.set()
        thread.join()
