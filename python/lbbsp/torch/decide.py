"""The decision every rank makes alike: a step's reports, as every rank received them, checked against the sizes
every rank holds, then the balancer's sizes for the step ``lag`` ahead of the next one. The same reports in, the
same sizes out, so no sizes travel back."""

import time
from typing import Any, Dict, List, Sequence

import numpy as np

import lbbsp

from .exchange import ReportExchange
from .report import Reports, disagreement
from .sizes import DecidedSizes


class Decisions:
    """The balancer, the decided batch vectors by global step (``sizes``), and this rank's errors building the
    reports of steps not decided from yet."""

    def __init__(self, balancer_args: Dict[str, Any], ranks: List[int], rank: int, exchange: ReportExchange,
                 timing: Dict[str, float], lag: int) -> None:
        self._args, self._ranks, self._rank, self._exchange = balancer_args, ranks, rank, exchange
        self._timing = timing  # the LoadBalancer's: "wait_s" and "decide_s" added here
        self.balancer = lbbsp.Balancer(**balancer_args)
        self._no_cap = np.full(len(ranks), np.iinfo(np.int64).max, dtype=np.int64)  # mem_cap: none
        self.sizes = DecidedSizes.repeated(0, lag, self.balancer.initial())
        self.decided = -1  # the last step whose reports were decided from
        self.report_errors: Dict[int, BaseException] = {}  # step -> this rank's error building its report

    def arrived_through(self, last: int) -> bool:
        """Whether the reports through(last, block=True) takes are all here (it would not wait)."""
        j = self.decided + 1
        while j <= last and self._exchange.launched(j):
            if not self._exchange.arrived(j):
                return False
            j += 1
        return True

    def through(self, last: int, block: bool, lag: int) -> float:
        """Decides from the reports of the steps up to ``last`` that have left (waiting for them if block);
        returns the seconds waited."""
        waited = 0.0
        while self.decided < last and self._exchange.launched(self.decided + 1):
            j = self.decided + 1
            if not block and not self._exchange.arrived(j):
                break
            before = self._exchange.waited_s
            reports = Reports(self._exchange.take(j))
            waited += self._exchange.waited_s - before
            self._apply(j, reports, lag)
            self.decided = j
        self._timing["wait_s"] += waited
        return waited

    def _apply(self, j: int, reports: Reports, lag: int) -> None:
        """Checks step j's reports (every rank sees the same, so every rank raises alike) and decides j+lag+1:
        in one call to the extension where every report is the usual, else here, naming what is not."""
        t = time.perf_counter()
        decided = None if j in self.report_errors else self._decided(j, lag, self.balancer.next_from_report_rows,
                                                                     reports.rows, self.sizes[j])
        if decided is None:  # a report not the usual: checked here, naming what
            decided = self._decide_checked(j, reports, lag)
        self.sizes.decide(j + lag + 1, decided)
        self._timing["decide_s"] += time.perf_counter() - t

    def _decide_checked(self, j: int, reports: Reports, lag: int) -> np.ndarray:
        """Step j+lag+1's sizes from step j's reports, each checked (raising on every rank alike)."""
        self._check(j, reports)
        caps, measured = reports.mem_caps, reports.measured_batches
        mem_cap = self._no_cap  # 0 reported: no cap
        if caps.any():
            mem_cap = mem_cap.copy()
            mem_cap[caps > 0] = caps[caps > 0]
        if (measured < 0).any():  # on CUDA the first window is read a step late: keep the sizes, capped
            return self._keep_within(self.sizes[j + lag], mem_cap)
        x = reports.exo
        return self._decided(j, lag, self.balancer.next_unchecked, measured.astype(np.int64), reports.compute_s,
                             x, x, mem_cap)

    def decided_in_c(self, j: int, lag: int, sizes: np.ndarray, waited_s: float, decide_s: float) -> None:
        """Step j+lag+1's sizes, decided from step j's reports in lbbsp.torch.native's one call."""
        self.balancer.advance()
        self.sizes.decide(j + lag + 1, sizes)
        self.decided = j
        self._timing["wait_s"] += waited_s
        self._timing["decide_s"] += decide_s

    @staticmethod
    def failure(j: int, lag: int, error: str) -> RuntimeError:
        """The error when deciding from step j's reports failed (alike on every rank: raised everywhere)."""
        return RuntimeError(f"LoadBalancer: step {j}: deciding the sizes of step {j + lag + 1} failed on every "
                            f"rank: {error}")

    @staticmethod
    def _decided(j: int, lag: int, decide: Any, *args: Any) -> Any:
        """decide(*args), an error in it named with the step (the same on every rank: re-raised everywhere)."""
        try:
            return decide(*args)
        except Exception as e:
            raise Decisions.failure(j, lag, f"{type(e).__name__}: {e}") from e

    def _check(self, j: int, reports: Reports) -> None:
        """Every rank's report built (else every rank raises, naming the rank), from the same decided sizes, and
        for the batch decided. Each rank checked its own report's figures before sending it."""
        error = self.report_errors.pop(j, None)
        failed = reports.failed_ranks
        if failed:
            self._exchange.fail(j, failed, error if self._rank == failed[0] else None)
        sums = reports.checksums
        if not (sums == sums[0]).all():
            raise RuntimeError(disagreement(j, sums, self._ranks))
        batch = reports.batches  # whole numbers (float32 holds them to 2^24)
        if not np.array_equal(batch, self.sizes[j]):
            raise RuntimeError(f"LoadBalancer: step {j}: the ranks report batches {batch.tolist()}, not the "
                               f"decided {self.sizes[j].tolist()}")

    def _keep_within(self, sizes: np.ndarray, mem_cap: np.ndarray) -> np.ndarray:
        """The same sizes again, or where a rank's memory cap is below its size the nearest split in the same
        proportions that fits the caps (and min_batch)."""
        if (sizes <= mem_cap).all():
            return sizes.copy()
        floor, world, x = self._args["min_batch"], len(self._ranks), self._args["global_batch"]
        return lbbsp.assign_by_speed(np.maximum(sizes, 1).astype(np.float64), x,
                                     min=[floor] * world if floor else None, max=np.minimum(mem_cap, x))

    def restart(self, step: int, lag: int) -> None:
        """A fresh balancer from an equal split at ``step`` (another world size: the history is per rank)."""
        self.balancer = lbbsp.Balancer(**self._args)
        # initial() only where nothing was saved: it draws from the random balancer's generator
        self.sizes = DecidedSizes.repeated(step, step + lag, self.balancer.initial())
        self._resume(step)

    def load(self, balancer_state: str, sizes: Sequence[Sequence[int]], step: int, lag: int) -> None:
        """The balancer and the decided sizes of a saved state, continuing at ``step``."""
        self.balancer.load_state(balancer_state)
        self.sizes = DecidedSizes.from_saved(sizes, step, step + lag)
        self._resume(step)

    def _resume(self, step: int) -> None:
        self.decided = step - 1
        self.report_errors.clear()
