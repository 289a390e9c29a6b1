"""This rank's CPU share, memory and load from /proc, measured by the C++ runtime's own monitor
(runtime/monitor.cpp, compiled into the extension), so lbbsp.torch and ``lbbsp train`` report the same."""

import time
from typing import Any, Callable, List, Optional

from .. import _lbbsp


class ResourceMonitor:
    """CPU share left by other processes on this rank's CPUs, memory available and run-queue load per CPU, over
    the interval since the last sample (the first: since construction), in ``lbbsp.RANK_EXO``'s order.

    A sample within ``min_interval_s`` of the last one read from /proc returns that one again: the CPU share
    moves in 10 ms ticks and the C++ monitor reports the last full window of 40 ms (4 ticks) meanwhile, so a
    read closer to the last adds little, while each costs 50-150 us in a training step (caches cold after
    backward): with steps of 25 ms, one read every other step."""

    def __init__(self, min_interval_s: float = 0.04, source: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        #: what reads /proc: the C++ runtime's monitor (anything with a sample() of the same figures will do)
        self.source = source if source is not None else _lbbsp.ResourceMonitor()
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._last: Optional[List[float]] = None
        self._read_at = 0.0

    def sample(self) -> List[float]:
        now = self._clock()
        if self._last is None or now - self._read_at >= self.min_interval_s:
            self._last, self._read_at = list(self.source.sample()), now
        return self._last
