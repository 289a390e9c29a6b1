"""The step clock: a rank's time in a step, from leaving one barrier to reaching the next, less its waits.

With a DDP model the barrier is the gradient allreduce: the window of step k runs from the moment the last bucket's
allreduce of step k-1 completed to the moment the last bucket of step k is ready, and the report leaves from the
comm hook then (work after backward(), the optimizer step and step() itself count in the next window). Otherwise
(no model, a step without backward) the window runs from leaving step() to entering the next and the report leaves
from step(). HostClock times on the host; DeviceClock (CUDA) times both moments as events on the model's device:
the window is the device's time between them, read when the device has run it, so step k's report carries window
k-1 (the host never waits for its own backward; it waits for window k-1's end only when it runs over a step ahead).
"""

import contextlib
import time
from typing import Any, Iterator, List, Optional, Tuple

import torch


class StepClock:
    """What both clocks share: the window's opening, its untimed blocks, its waits and a caller's own measure."""

    on_device = False

    def __init__(self) -> None:
        self.recorded_s: Optional[float] = None  # record_compute's seconds in this step, replacing the measure
        self.restart()

    def restart(self, opened: Any = None) -> None:
        """Opens the next step's window (``opened``: on CUDA, the event after the allreduce that opens it)."""
        self.recorded_s = None
        self._untimed_s = self._wait_s = 0.0
        self._started_s = time.perf_counter()

    def reset(self) -> None:
        """A fresh window with nothing carried over from the steps before (after a resume)."""
        self.restart()

    def record(self, seconds: float) -> None:
        self.recorded_s = (self.recorded_s or 0.0) + seconds

    def add_wait(self, seconds: float) -> None:
        """Seconds blocked on the other ranks (the report exchange, a second allreduce in one step)."""
        self._wait_s += seconds

    def ready_marker(self) -> Any:
        """Where this rank's backward ends (an event on CUDA; None on the host, which reads its clock)."""
        return None

    def off_the_clock(self) -> "contextlib.AbstractContextManager[None]":
        """A block of the step whose time must not count (a wait the host sits out)."""
        return contextlib.nullcontext()


class HostClock(StepClock):
    """The window on the host's clock (time.perf_counter)."""

    def __init__(self) -> None:
        self._after_barrier: Optional[Tuple[int, float, int]] = None  # (step, seconds, batch) after its allreduce
        super().__init__()

    def reset(self) -> None:
        self._after_barrier = None
        super().reset()

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add_untimed(time.perf_counter() - t0)

    def add_untimed(self, seconds: float) -> None:
        self._untimed_s += seconds

    def left_barrier(self, sends: bool, ready: Any, ready_s: float) -> None:
        """This rank left the gradient allreduce (in the thread that completed it)."""
        if sends:  # step k+1's window opens as the barrier is left
            self.restart()
        else:
            self._wait_s += time.perf_counter() - ready_s  # a second backward in one step

    def window_s(self, now: float) -> float:
        """This step's time so far: since the window opened, less the waits and the untimed() blocks."""
        return max(0.0, now - self._started_s - self._wait_s - self._untimed_s)

    def note_work_after_barrier(self, step: int, now: float, batch: int) -> None:
        """step() of a step whose report left from the comm hook: what ran since its allreduce was its own work
        after the barrier (the optimizer step), which opens the next window."""
        self._after_barrier = (step, self.window_s(now), batch)

    def measure(self, step: int, batch: int, now: float, ready: Any,
                exo: List[float]) -> Tuple[float, int, List[float]]:
        """(seconds, their batch, the monitor's figures) of step ``step``'s window, closed at ``now``."""
        return self._on_this_batch(step, batch, self.window_s(now)), batch, exo

    def _on_this_batch(self, k: int, n: int, window_s: float) -> float:
        """With a DDP model on the CPU step k's window opened as step k-1's allreduce completed: it began with
        step k-1's work after backward (the optimizer step, anything after backward()), done on step k-1's batch.
        Where the size changed that part is scaled to step k's batch, as it will cost from now on; otherwise a
        rank cut from 128 to 49 samples would report the 128's work over 49 and look slow, once per change.
        The scale is bounded to [1/4, 4]: a per-step constant in that part (the optimizer) does not scale."""
        if self._after_barrier is None:
            return window_s
        step, after_s, before = self._after_barrier
        if step != k - 1 or before <= 0 or n <= 0 or before == n:
            return window_s
        ratio = min(4.0, max(0.25, n / before))
        return max(0.0, window_s + min(after_s, window_s) * (ratio - 1.0))


class DeviceClock(StepClock):
    """The window on the model's CUDA device: events on its current stream, read a step later."""

    on_device = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._closing: Optional[tuple] = None  # the window closed at the last bucket: (batch, opened, ready, exo)
        self._unread: Optional[tuple] = None  # the last closed window not yet reported, with its waits' events
        self._events: List[Tuple[Any, Any]] = []
        super().__init__()

    def restart(self, opened: Any = None) -> None:
        """Also: the window just closed, with the events of its waits, waits to be read."""
        self._unread = None if self._closing is None else (*self._closing, self._events)
        self._closing = None
        self._events, self._opened = [], opened
        super().restart(opened)

    def ready_marker(self) -> Any:
        return self.event()

    def event(self) -> Any:
        """A timing event recorded on the model's device's current stream (whichever device is current here)."""
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    @contextlib.contextmanager
    def off_the_clock(self) -> Iterator[None]:
        """A host block whose time must not count: the device's time between events recorded at its start and
        end is subtracted from the window. That is the time the device sat idle while the host waited (a device
        still busy with work queued before is not idle, and that work still counts), plus the device work queued
        inside the block."""
        start = self.event()
        try:
            yield
        finally:
            self._events.append((start, self.event()))

    def untimed(self) -> "contextlib.AbstractContextManager[None]":
        """The device's time across the block: what it ran of the block's work, or sat idle."""
        return self.off_the_clock()

    def left_barrier(self, sends: bool, ready: Any, ready_s: float) -> None:
        if sends:  # step k+1's window opens where the device leaves the barrier
            self.restart(self.event())
        else:
            self._events.append((ready, self.event()))

    def window_s(self, now: float) -> float:
        """A step without backward (or no DDP model): the device's queued work is waited for first, and the
        events' spans (queued before it) are subtracted from the host's time."""
        torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        device_waits = sum(a.elapsed_time(b) for a, b in self._events) / 1e3
        return max(0.0, now - self._started_s - device_waits - self._wait_s - self._untimed_s)

    def note_work_after_barrier(self, step: int, now: float, batch: int) -> None:
        """Nothing: the device may still run the optimizer, and the host does not wait for it here."""

    def measure(self, step: int, batch: int, now: float, ready: Any,
                exo: List[float]) -> Tuple[float, int, List[float]]:
        """With ``ready`` (the comm hook's event) the window that closed there is kept for the next report and
        the previous one is read: (seconds, its batch, its figures), or (0, -1, exo) where none was measured."""
        if ready is None:
            return self.window_s(now), batch, exo
        self._closing = (batch, self._opened, ready, exo)
        window = self._read_unread()
        return (0.0, -1, exo) if window is None else window

    def _read_unread(self) -> Optional[Tuple[float, int, List[float]]]:
        """The last closed window's (seconds on the device, batch, figures), or None where there is none (the
        first step, after a step without backward or a resume). The device has run it by now unless the host is
        over a step ahead: then this waits for its end, which keeps the host at most a step ahead."""
        if self._unread is None or self._unread[1] is None:  # the first window opened on the host: not measured
            return None
        n, opened, ready, exo, events = self._unread
        self._unread = None
        for event in (ready, opened, *(e for pair in events for e in pair)):
            if not event.query():
                event.synchronize()
        waits = sum(a.elapsed_time(b) for a, b in events) / 1e3
        return max(0.0, opened.elapsed_time(ready) / 1e3 - waits), n, exo
