"""The control plane: every rank's report of a step reaches every rank in one asynchronous all-gather on gloo
groups of its own, entered by every process as PyTorch requires; failures are named, hangs time out."""

import atexit
import collections
import datetime
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

from . import hooks
from .report import REPORT, read_rows, write_row


def group_ranks(group: Optional[dist.ProcessGroup]) -> List[int]:
    """The global ranks of ``group`` (None: the whole world), in group-rank order."""
    if group is None or group == dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def control_groups(ranks: List[int], timeout: datetime.timedelta) -> Tuple[dist.ProcessGroup, ...]:
    """Two gloo groups over ``ranks`` (reports, error messages). PyTorch wants every process to
    enter every new_group in the same order, so with data-parallel subgroups each process learns all of them
    (all_gather_object over the world) and enters the new_group of each one, keeping its own."""
    world = dist.get_world_size()
    if len(ranks) == world:
        layout = [ranks]
    else:
        everyone: List[Optional[List[int]]] = [None] * world
        dist.all_gather_object(everyone, ranks)
        layout = sorted({tuple(r) for r in everyone})
        seen: Dict[int, Tuple[int, ...]] = {}
        for g in layout:
            for r in g:
                if r in seen:
                    raise ValueError(f"LoadBalancer: process_group: rank {r} is in two balanced groups, "
                                     f"{list(seen[r])} and {list(g)}: give each process one data-parallel group")
                seen[r] = g
    mine: Tuple[dist.ProcessGroup, ...] = ()
    for g in layout:
        made = tuple(dist.new_group(ranks=list(g), backend="gloo", timeout=timeout) for _ in range(2))
        if tuple(ranks) == tuple(g):
            mine = made
    return mine


_Future = torch.futures.Future
_LIVE: "weakref.WeakSet[ReportExchange]" = weakref.WeakSet()


# At exit, before the interpreter shuts down: a gloo thread that needs the GIL after that point (to drop a callback,
# its future or the tensors of a collective it completed) is ended inside a C++ destructor and the process aborts
# ("terminate called without an active exception"). Bounded: a collective whose peer is gone never completes.
EXIT_WAIT_S = 10.0


@atexit.register
def _drain_at_exit() -> None:
    """Waits for the reports still in flight, then for every collective that carries a callback of ours."""
    for exchange in list(_LIVE):
        exchange.drain(quiet=True)
    if not any(exchange.broken for exchange in list(_LIVE)):
        hooks.wait_for_collectives(EXIT_WAIT_S)
        for exchange in list(_LIVE):  # and those the C++ step path launched (held there likewise)
            if exchange.native is not None:
                exchange.native.wait_held(int(EXIT_WAIT_S * 1000))


class ReportExchange:
    """The reports of each step in flight (an async all_gather per step), taken in step order."""

    def __init__(self, ranks: List[int], rank: int, timeout_s: float) -> None:
        self.ranks, self.rank, self.world = ranks, rank, len(ranks)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.group, self.errors = control_groups(ranks, self.timeout)
        # step -> (its collective, the all-gather's outputs or (the report block, the future DDP waits for))
        self._flight: Dict[int, Tuple[dist.Work, Union[List[torch.Tensor], Tuple[torch.Tensor, _Future]]]] = {}
        # Taken collectives stay referenced a few steps: the gloo thread may still be finishing one after wait()
        # returned, and must not drop the last reference to its tensors (that needs the GIL).
        self._retired: collections.deque = collections.deque(maxlen=4)
        self.waited_s = 0.0  # seconds spent blocked in take(), since the owner last cleared it
        self.broken = False  # a collective failed: reports still in flight will not arrive
        self._rides = self._gathers = 0  # steps whose reports rode in a gradient bucket / took the all-gather
        self._buffers_made = 0
        #: the C++ step path's state (lbbsp.torch.native), whose hook launches the reports, or None
        self.native = None
        self.piggybacks = True  # False once the gradients' backend refused a coalesced allreduce
        self._spare: List[torch.Tensor] = []  # report blocks not in flight
        _LIVE.add(self)

    def launch(self, step: int, report: np.ndarray) -> None:
        mine = torch.from_numpy(report)
        out = [torch.zeros_like(mine) for _ in range(self.world)]
        self._flight[step] = (dist.all_gather(out, mine, group=self.group, async_op=True), out)
        self._gathers += 1

    @property
    def rides(self) -> int:
        """Steps whose reports rode in a gradient bucket."""
        return self._rides + (self.native.rides if self.native is not None else 0)

    @property
    def gathers(self) -> int:
        """Steps whose reports took a collective of their own (the all-gather, or the C++ path's allreduce)."""
        return self._gathers + (self.native.separate if self.native is not None else 0)

    @property
    def buffers_made(self) -> int:
        """Report blocks made (each is reused once read)."""
        return self._buffers_made + (self.native.blocks_made if self.native is not None else 0)

    # A report rides in the last gradient bucket's own allreduce (a world x (REPORT + 1) block beside the bucket,
    # this rank's row filled and zeros elsewhere: the SUM gives every row) when the bucket is float32 or float64 and
    # small enough that gloo's copies of it (into one buffer and back) cost less than another collective's round
    # trip; else the all-gather above. The checksum travels as two 16-bit halves: float32 holds integers to 2^24.
    PIGGYBACK_MAX_BYTES = 4 << 20

    def can_piggyback(self, bucket: torch.Tensor) -> bool:
        return self.piggybacks and bucket.dtype in (torch.float32, torch.float64) and \
            bucket.numel() * bucket.element_size() <= self.PIGGYBACK_MAX_BYTES

    def no_piggyback(self, block: torch.Tensor) -> None:
        """The gradients' backend refused the coalesced allreduce: the reports take the all-gather from now on."""
        self.piggybacks = False
        self._spare.append(block)

    def piggyback(self, report: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """The report block to allreduce (SUM) with the bucket, of the bucket's ``dtype`` (gloo's coalesced
        allreduce takes one dtype); give it to ride(step, ...), and take(step) reads the reports once the
        allreduce is done. Blocks come back when taken and are reused. The bucket itself is not copied here:
        gloo's coalesced allreduce copies it in C++, where a copy into a larger tensor of our own cost 100-140
        us of this thread's CPU a step in Python (2 ranks, a 0.1 MB bucket, caches cold)."""
        if self._spare and self._spare[0].dtype != dtype:
            self._spare.clear()
        if not self._spare:
            self._spare.append(torch.empty(self.world, REPORT + 1, dtype=dtype))
            self._buffers_made += 1
        block = self._spare.pop()
        write_row(block.numpy(), self.rank, report)
        return block

    def ride(self, step: int, work: Optional[dist.Work], block: torch.Tensor, done: torch.futures.Future) -> None:
        """The step's reports travel in ``block``, reduced with the bucket (or FSDP2's reduce-scatter: no work, done
        already); ``done`` is the future DDP waits for (the allreduce's, through the hook's callback): once it is
        done the reports are there to read, also while gloo's thread still finishes the work itself (a wait() for
        that took 30-130 us in a step in five)."""
        self._flight[step] = (work, (block, done))
        self._rides += 1

    def launched(self, step: int) -> bool:
        return step in self._flight or (self.native is not None and self.native.launched(step))

    def arrived(self, step: int) -> bool:
        if step not in self._flight:
            return self.native.arrived(step)
        work, out = self._flight[step]
        return out[1].done() if isinstance(out, tuple) else work.is_completed()

    def take(self, step: int) -> np.ndarray:
        """Every rank's report of ``step`` (world x REPORT), waiting at most the timeout for it."""
        if step not in self._flight:
            return self._take_native(step)
        work, out = self._flight.pop(step)
        self._retired.append((work, out))
        t0 = time.perf_counter()
        try:
            if isinstance(out, tuple) and out[1].done():
                out[1].value()  # raises what the allreduce raised
            else:
                work.wait(self.timeout)
        except RuntimeError as e:
            raise self.failed(step, e) from None
        finally:
            self.waited_s += time.perf_counter() - t0
        if isinstance(out, list):
            return torch.stack(out).numpy()
        block = out[0]
        reports = read_rows(block.numpy())
        self._spare.append(block)  # read: free for a later step's piggyback
        return reports

    def _take_native(self, step: int) -> np.ndarray:
        """take() of a report that the C++ hook launched (read there from its summed block)."""
        t0 = time.perf_counter()
        try:
            return self.native.take(step, int(self.timeout.total_seconds() * 1000))
        except RuntimeError as e:
            raise self.failed(step, e) from None
        finally:
            self.waited_s += time.perf_counter() - t0

    def failed(self, step: int, error: RuntimeError) -> RuntimeError:
        """The error for a step whose reports did not come (the collective failed or timed out), naming the ranks
        that do not answer."""
        first = (str(error).splitlines() or [type(error).__name__])[0]
        return RuntimeError(f"LoadBalancer: step {step}: exchanging reports failed on rank {self.ranks[self.rank]}: "
                            f"{self.missing_ranks(step)}; {first}")

    def in_flight(self) -> List[int]:
        """The steps whose reports are in flight, in order."""
        return sorted(set(self._flight) | set(self.native.in_flight() if self.native is not None else ()))

    def drain(self, quiet: bool = False) -> None:
        """Waits for the reports still in flight and forgets them (quiet: whatever happens to them; none after
        a failure: they would only time out)."""
        if self.broken and quiet:
            return
        for step in self.in_flight():
            try:
                self.take(step)
            except Exception:  # re-raised unless quiet: at exit a failed peer is not this process's error
                if not quiet:
                    raise

    def fail(self, step: int, failed: Sequence[int], error: Optional[BaseException]) -> None:
        """Every rank raises, naming the failed ranks and carrying the first one's message."""
        src = failed[0]
        message = [f"{type(error).__name__}: {error}" if self.rank == src else None]
        try:
            dist.broadcast_object_list(message, src=self.ranks[src], group=self.errors)
        except RuntimeError as e:
            message = [f"(its message did not arrive: {str(e).splitlines()[0]})"]
        who = (f"rank {self.ranks[src]} failed in its report" if len(failed) == 1
               else f"ranks {', '.join(str(self.ranks[r]) for r in failed)} failed in their reports")
        where = "" if self.rank == src else \
            f" (this is rank {self.ranks[self.rank]}; see rank {self.ranks[src]}'s log for the traceback)"
        raise RuntimeError(f"LoadBalancer: step {step}: {who}: rank {self.ranks[src]}: {message[0]}"
                           f"{where}") from error

    def check_same(self, settings: Dict[str, object], refused: Optional[str] = None) -> None:
        """Raises ValueError on every rank when the ranks were built with different ``settings`` (one all-gather
        at construction): a per-rank dataset_size or seed would cut other samples under the same sizes. A rank
        whose own arguments raised passes its error as ``refused`` (and no settings): the others raise too,
        naming it, instead of waiting for that rank until the timeout; that rank's own error goes on."""
        everyone: List[Optional[Tuple[Dict[str, object], Optional[str]]]] = [None] * self.world
        dist.all_gather_object(everyone, (settings, refused), group=self.errors)
        refusals = [(self.ranks[r], why) for r, (_, why) in enumerate(everyone) if why is not None]  # type: ignore
        if refused is not None:
            return
        if refusals:
            raise ValueError("LoadBalancer: every rank stops: " + "; ".join(
                f"rank {r} could not build its LoadBalancer ({why})" for r, why in refusals) +
                ". Fix that rank's arguments")
        for key in settings:
            values = [s[0][key] for s in everyone]  # type: ignore[index]
            if any(v != values[0] for v in values):
                by_value: Dict[str, List[int]] = {}
                for r, v in enumerate(values):
                    by_value.setdefault(repr(v), []).append(self.ranks[r])
                parts = "; ".join(f"{v} on {'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))}"
                                  for v, rs in by_value.items())
                raise ValueError(f"LoadBalancer: the ranks were built with different {key}: {parts}. Every rank "
                                 f"must pass the same {key}" + _SAME_HINTS.get(key, ""))

    def missing_ranks(self, step: int) -> str:
        """Which ranks do not answer, the same verdict on every rank that does: each rank marks itself alive in
        the process group's store and, after a few seconds, names the ranks whose mark is missing (a store, not
        a collective: a gloo collective that times out closes its group). Marks the exchange broken: a job that
        failed does not wait at exit for reports that will never come."""
        self.broken = True
        wait = min(10.0, self.timeout.total_seconds())
        try:
            silent = [self.ranks[r] for r in self._silent_ranks(step, wait)]
        except Exception as e:  # noqa: BLE001 - report whatever the check said
            return f"health check failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        if not silent:
            return "every rank answered a health check afterwards"
        who = f"rank {silent[0]}" if len(silent) == 1 else f"ranks {', '.join(map(str, silent))}"
        return f"not answering: {who} (silent in a health check of {wait:.0f} s)"

    def _silent_ranks(self, step: int, wait: float) -> List[int]:
        store = dist.distributed_c10d._get_default_store()
        prefix = f"lbbsp-health/{'-'.join(map(str, self.ranks))}/{step}/"
        keys = [prefix + str(r) for r in range(self.world)]
        store.set(keys[self.rank], "alive")
        try:
            store.wait(keys, datetime.timedelta(seconds=wait))
            return []
        except RuntimeError:  # a timeout: see who is missing
            return [r for r in range(self.world) if not _has_key(store, keys[r])]


_SAME_HINTS = {
    "dataset_size": " (the whole dataset's size, not this rank's shard: every rank draws from one permutation)",
    "model_group": " (the DDP model's process_group and the LoadBalancer's process_group must be the same group)",
    "model": " (a DistributedDataParallel on every rank, or None on every rank)",
}

# What a failed collective's error says (gloo, NCCL, the c10d store): a timeout or a lost peer, not the user's code.
_COLLECTIVE_MARKS = ("gloo", "nccl", "timed out", "connection closed", "connection reset", "socket timeout",
                     "broken pipe", "watchdog")


def is_collective_error(error: BaseException) -> bool:
    """Whether an exception from backward() is a collective failing (a peer hung or died), as opposed to an
    error in the user's own code, which is re-raised untouched."""
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(mark in text for mark in _COLLECTIVE_MARKS)


def _has_key(store: dist.Store, key: str) -> bool:
    """Whether ``key`` is set (Store.check is missing in PyTorch 1.13: a wait that ends at once or times out)."""
    try:
        store.wait([key], datetime.timedelta(milliseconds=50))
        return True
    except RuntimeError:
        return False
