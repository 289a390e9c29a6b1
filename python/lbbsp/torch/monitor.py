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
        """(busy, total) clock ticks of this rank's CPUs and the run queue, from one read of /proc/stat (its
        per-CPU lines come first; the long interrupt line is not parsed)."""
        try:
            with open("/proc/stat", "rb") as f:
                data = f.read()
        except OSError:
            return None
        busy = total = 0
        for line in data.split(b"\n", 1 + (max(self._cpus) + 1 if self._cpus else 1024))[1:]:
            if not line.startswith(b"cpu"):
                break
            parts = line.split()
            if self._cpus and int(parts[0][3:]) not in self._cpus:
                continue
            user, nice, sys_, idle, iowait, irq, softirq, steal = (list(map(int, parts[1:9])) + [0] * 8)[:8]
            b = user + nice + sys_ + irq + softirq + steal
            busy += b
            total += b + idle + iowait
        at = data.find(b"procs_running ")
        running = int(data[at + 14:data.index(b"\n", at)]) if at >= 0 else 0
        return busy, total, running

    @staticmethod
    def _memory() -> float:
        """MemAvailable / MemTotal (both near the top of /proc/meminfo: the rest is not read)."""
        with open("/proc/meminfo", "rb") as f:
            head = f.read(512)
        fields = dict(line.split(b":", 1) for line in head.split(b"\n")[:6] if b":" in line)
        return int(fields[b"MemAvailable"].split()[0]) / int(fields[b"MemTotal"].split()[0])

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
            mem = self._memory()
        except (OSError, KeyError, ValueError, ZeroDivisionError):
            pass
        self._last, self._last_own = now, own
        return [cpu, mem, load]
