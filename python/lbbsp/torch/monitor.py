"""This rank's CPU share, memory and load from /proc, as the C++ runtime measures them (runtime/monitor.cpp)."""

import os
import time
from typing import List


class ResourceMonitor:
    """CPU share left by other processes on this rank's CPUs, memory available and run-queue load, measured
    over the last interval from /proc as the C++ runtime measures them (1.0, 1.0, 0.0 where /proc is absent)."""

    def __init__(self) -> None:
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._cpu_times()
        self._last_own = time.process_time()

    def _cpu_times(self):
        busy = total = running = 0
        try:
            with open("/proc/stat") as f:
                for line in f:
                    if line.startswith("procs_running "):
                        running = int(line.split()[1])
                    if not line.startswith("cpu") or not line[3].isdigit():
                        continue
                    parts = line.split()
                    cpu = int(parts[0][3:])
                    if self._cpus and cpu not in self._cpus:
                        continue
                    v = [int(x) for x in parts[1:9]] + [0] * max(0, 9 - len(parts))
                    user, nice, sys_, idle, iowait, irq, softirq, steal = v[:8]
                    b = user + nice + sys_ + irq + softirq + steal
                    busy += b
                    total += b + idle + iowait
        except OSError:
            return None
        return busy, total, running

    def sample(self) -> List[float]:
        now, own = self._cpu_times(), time.process_time()
        cpu, mem, load = 1.0, 1.0, 0.0
        if now is not None and self._last is not None:
            total_s = (now[1] - self._last[1]) / self._tick
            others = max(0.0, (now[0] - self._last[0]) / self._tick - (own - self._last_own))
            if total_s > 0:
                cpu = min(1.0, max(0.0, 1.0 - others / total_s))
            load = now[2] / max(1, os.cpu_count() or 1)
        try:
            with open("/proc/meminfo") as f:
                info = {line.split(":")[0]: float(line.split()[1]) for line in f if ":" in line}
            mem = info["MemAvailable"] / info["MemTotal"]
        except (OSError, KeyError, ValueError, ZeroDivisionError):
            pass
        self._last, self._last_own = now, own
        return [cpu, mem, load]
