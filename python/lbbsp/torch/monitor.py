"""This rank's CPU share, memory and load from /proc, measured by the C++ runtime's own monitor
(runtime/monitor.cpp, compiled into the extension), so lbbsp.torch and ``lbbsp train`` report the same."""

from typing import List

from .. import _lbbsp


class ResourceMonitor:
    """CPU share left by other processes on this rank's CPUs, memory available and run-queue load per CPU, over
    the interval since the last sample (the first: since construction), in ``lbbsp.RANK_EXO``'s order."""

    def __init__(self) -> None:
        self._monitor = _lbbsp.ResourceMonitor()

    def sample(self) -> List[float]:
        return self._monitor.sample()
