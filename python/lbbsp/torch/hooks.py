"""The DDP communication hook that SUMS gradients over ranks (DDP's default divides by the world size), and the
callbacks on collectives' futures, counted until the thread that completes them has let them go.

Why they are counted: a gloo worker thread completes a collective's future, runs its Python callback, and only
then drops the callback, which needs the GIL. Where that drop comes after the main thread has begun shutting the
interpreter down, CPython ends the gloo thread (pthread_exit) inside a C++ destructor and the process aborts
("terminate called without an active exception"). ``wait_for_callbacks`` (run at exit, while Python still runs)
waits until every callback has been dropped."""

import threading
from typing import Callable, Optional

import torch
import torch.distributed as dist

_released = threading.Condition()
_unreleased = 0  # callbacks made by then() that no thread has dropped yet


class _Counted:
    """A future's callback, counted from its making until the thread that completes the future has dropped it
    and all that went with it."""

    __slots__ = ("_callback",)

    def __init__(self, callback: Callable[[torch.futures.Future], object]) -> None:
        global _unreleased
        self._callback = callback
        with _released:
            _unreleased += 1

    def __call__(self, future: torch.futures.Future) -> object:
        return self._callback(future)

    def __del__(self) -> None:
        global _unreleased
        self._callback = None  # dropped first: what it held goes before the count says it went
        with _released:
            _unreleased -= 1
            _released.notify_all()


def then(future: torch.futures.Future, callback: Callable[[torch.futures.Future], object]) -> torch.futures.Future:
    """``future.then(callback)``, counted until the completing thread has dropped the callback. The callback must
    not hold the last reference to anything whose teardown needs Python for long (a LoadBalancer, a process group):
    a gloo thread would tear it down."""
    return future.then(_Counted(callback))


def unreleased_callbacks() -> int:
    """Callbacks made by then() that the threads completing their futures have not dropped yet."""
    with _released:
        return _unreleased


def wait_for_callbacks(timeout_s: float) -> bool:
    """Waits (the GIL released) until no thread holds a callback made by then(), at most ``timeout_s``; whether
    none is left. A collective that never completes (a peer gone) keeps its callback: hence the bound."""
    with _released:
        return _released.wait_for(lambda: _unreleased == 0, timeout=timeout_s)


def first_tensor(f: torch.futures.Future) -> torch.Tensor:
    """An allreduce future's tensor (its value is a list of one)."""
    return f.value()[0]


def sum_allreduce_hook(process_group: Optional[dist.ProcessGroup],
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the gradient SUM over ranks (DDP's default hook divides it by the world size)."""
    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    group = process_group if process_group is not None else dist.group.WORLD
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return then(work.get_future(), first_tensor)
