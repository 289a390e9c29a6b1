"""The DDP communication hook that SUMS gradients over ranks (DDP's default divides by the world size), and the
collectives whose futures carry our Python callbacks, held until their worker thread is done with them.

Why they are held: a gloo worker thread completes a collective's future, runs its Python callback, completes the
callback's own future with the Python value it returned, and only then drops the callback and that future, which
needs the GIL. Where the thread held their last references (the LoadBalancer and the DDP model gone, as at the end
of a script) and the main thread had meanwhile begun shutting the interpreter down, CPython ended the gloo thread
(pthread_exit) inside a C++ destructor and the process aborted ("terminate called without an active exception").
Held here, the last references are dropped by the interpreter's own thread; ``wait_for_collectives`` (run at exit,
while Python still runs) waits until every held collective is done."""

import collections
import datetime
import threading
import time
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

_lock = threading.Lock()  # comm hooks run on autograd's threads (a device thread on CUDA)
_held: "collections.deque" = collections.deque()  # (work, the callback's future), oldest first


def then(work: dist.Work, callback: Callable[[torch.futures.Future], object]) -> torch.futures.Future:
    """``work.get_future().then(callback)``, with the work and the returned future held until the work is done
    (and so its worker thread with the callback). Those done since the last call are let go here."""
    future = work.get_future().then(callback)
    with _lock:
        while _held and _held[0][0].is_completed():
            _held.popleft()
        _held.append((work, future))
    return future


def wait_for_collectives(timeout_s: float) -> bool:
    """Waits (the GIL released) until every collective made by then() is done, at most ``timeout_s`` in all;
    whether all are. They stay held: the interpreter's thread drops them. A collective whose peer is gone never
    completes: hence the bound."""
    with _lock:
        works = [work for work, _ in _held]
    deadline = time.monotonic() + timeout_s
    for work in works:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            work.wait(datetime.timedelta(seconds=left))
        except RuntimeError:  # timed out, or the collective failed: nothing more will come of it
            return False
    return True


def _sum_options() -> "dist.AllreduceOptions":
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    if hasattr(opts, "asyncOp"):  # PyTorch >= 2.7: what all_reduce(async_op=True) sets
        opts.asyncOp = True
    return opts


def _coalesced_sum_options() -> "dist.AllreduceCoalescedOptions":
    opts = dist.AllreduceCoalescedOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    return opts


_SUM = _sum_options() if dist.is_available() else None
_COALESCED_SUM = _coalesced_sum_options() if dist.is_available() else None


def allreduce_sum(tensor: torch.Tensor, group: Optional[dist.ProcessGroup]) -> dist.Work:
    """``dist.all_reduce(tensor, group=group, async_op=True)`` as the process group's own call, the way DDP's C++
    hook makes it: the Python wrapper's checks cost 50-60 us of CPU a step with the caches cold, for a dense
    tensor of ours that they never refuse."""
    return (group if group is not None else dist.group.WORLD).allreduce([tensor], _SUM)


def allreduce_sum_coalesced(tensors: List[torch.Tensor], group: Optional[dist.ProcessGroup]) -> Optional[dist.Work]:
    """The SUM of several tensors of one dtype in one collective, in place (gloo: one buffer, one allreduce); None
    where the backend refuses it (one without a coalesced allreduce raises before anything is sent; any other
    error the caller's plain allreduce meets again)."""
    try:
        return (group if group is not None else dist.group.WORLD).allreduce_coalesced(tensors, _COALESCED_SUM)
    except (RuntimeError, NotImplementedError):
        return None


def first_tensor(f: torch.futures.Future) -> torch.Tensor:
    """An allreduce future's tensor (its value is a list of one)."""
    return f.value()[0]


def sum_allreduce_hook(process_group: Optional[dist.ProcessGroup],
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the gradient SUM over ranks (DDP's default hook divides it by the world size)."""
    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    return then(allreduce_sum(tensor, process_group), first_tensor)
