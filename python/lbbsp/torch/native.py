"""lbbsp.torch's per-step path in C++ (native_step.cpp beside this file), for a DDP or 1-D FSDP2 model on the CPU over
gloo: the comm hook (FSDP2: the reduce-scatter), the step clock, the /proc monitor's read and the report block of
ddp.py (fsdp.py), clock.HostClock and exchange.ReportExchange.piggyback, without Python or the GIL in the step.
Those stay as its reference and the fall-back. It is built on first use against the installed torch
(``torch.utils.cpp_extension``: a C++ compiler and ninja, ~30 s once, cached: build_directory());
``LBBSP_TORCH_NATIVE=0`` keeps the Python path, ``=1`` makes a failed build an error instead of a warning."""

import contextlib
import hashlib
import importlib.util
import os
import platform
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import fsdp
from .clock import HostClock
from .exchange import ReportExchange
from .monitor import ResourceMonitor
from .report import _COLUMN, checksum, read_metrics

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_step.cpp")
_LAYOUT = ("width", "batch", "compute_s", "exo", "mem_cap", "measured_batch", "status", "checksum")
_built: Optional[Tuple[Any, str]] = None  # (the module or None, why not)


def mode() -> str:
    """LBBSP_TORCH_NATIVE: "auto" (default: the C++ path on PyTorch 2.x where it builds), "0" (never) or "1"
    (must: a failed build raises). PyTorch 1.x (Debian's 1.13 ships no C++ headers) keeps the Python path."""
    value = os.environ.get("LBBSP_TORCH_NATIVE", "auto").strip().lower()
    if value not in ("auto", "0", "1"):
        raise ValueError(f"LBBSP_TORCH_NATIVE must be auto, 0 or 1, got {value!r}")
    if value == "auto" and int(torch.__version__.split(".")[0]) < 2:
        return "0"
    return value


def extension() -> Any:
    """The built extension, or None where LBBSP_TORCH_NATIVE=0 or it does not build (a warning, once)."""
    global _built
    if mode() == "0":
        return None
    if _built is None:
        try:
            _built = (_load(), "")
        except Exception as e:  # any failure to build falls back to the Python path (or raises, mode 1)
            _built = (None, _first_error(e))
            if mode() == "1":
                raise RuntimeError(f"LoadBalancer: LBBSP_TORCH_NATIVE=1 but the C++ step path did not build: "
                                   f"{_built[1]}") from e
            warnings.warn(f"LoadBalancer: the C++ step path did not build ({_built[1]}); the Python path runs, "
                          "0.1-0.5 ms more CPU a step. It needs a C++ compiler and ninja (pip install ninja); "
                          "LBBSP_TORCH_NATIVE=0 silences this")
    return _built[0]


def _first_error(error: BaseException) -> str:
    """The compiler's first error line in a failed build's message (else its last line)."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return next((line.strip() for line in lines if "error:" in line), lines[-1])


def build_directory() -> Tuple[str, str]:
    """(the folder, the module's name) of the build for this source, torch, Python and machine:
    LBBSP_TORCH_NATIVE_DIR or the user's cache (~/.cache/lbbsp/native), a sub-folder for each."""
    with open(_SOURCE, "rb") as f:
        build = f"{torch.__version__} {sys.version_info[:2]} {platform.machine()}".encode()  # what the .so is for
        digest = hashlib.sha256(f.read() + build).hexdigest()[:12]
    name = f"lbbsp_native_step_{digest}"
    root = os.environ.get("LBBSP_TORCH_NATIVE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lbbsp", "native")
    return os.path.join(root, name), name


def _load() -> Any:
    """The module, imported from its build where that is done (no ninja run, no cpp_extension import), else
    built first (ranks that start together: one builds, the others wait on its lock file)."""
    folder, name = build_directory()
    done = os.path.join(folder, "built")  # written once a build has loaded (the .so may exist half-linked)
    if os.path.exists(done):
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, name + ".so"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    with contextlib.suppress(ImportError):  # PyPI's ninja: its binary is off PATH in a venv not activated
        import ninja
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    from torch.utils.cpp_extension import load
    os.makedirs(folder, exist_ok=True)
    module = load(name, [_SOURCE], extra_cflags=["-O2"], build_directory=folder, verbose=False)
    with open(done, "w") as f:
        f.write(torch.__version__ + "\n")
    return module


def attach(lb: Any, model: Any) -> Any:
    """The C++ step path for a LoadBalancer on a host model, with its clock and its report exchange (ddp.attach
    registers its hook; fsdp.attach sends FSDP2's reduce-scatters through it where the report rides in the last
    one); None where it does not apply (no model, CUDA, micro-batches, HSDP, see make())."""
    if model is None or lb.clock.on_device or lb.micro_batches != 1:
        return None
    if lb._sharded and fsdp.scatters_a_step(model, lb.exchange.ranks) is None:
        return None
    group = fsdp.shard_group(model) if lb._sharded else getattr(model, "process_group", None) or dist.group.WORLD
    state = make(lb.rank, lb.world_size, lb._resources or lb._monitor, group, ReportExchange.PIGGYBACK_MAX_BYTES,
                 lb._decisions.report_errors, getattr(model, "_use_python_reducer", False))
    if state is not None:
        lb.clock = NativeClock(state)
        lb.exchange.native = state
        state.decide = state.decide_function()  # decide_step's one call, a plain CPython function
        state.arm(*_armed(lb))
    return state


def arm(lb: Any) -> None:
    """Tells the C++ state (if any) the step its hook reports next and decide_step closes: its number, its batch
    vector and that vector's checksum, the balancer to decide through, the reports' timeout."""
    if lb.native is not None:
        lb.native.arm(*_armed(lb))


def _armed(lb: Any) -> Tuple[Any, ...]:
    """arm()'s arguments: the step, the decided vectors from it on (its own and, with a lag, those after it) and
    their checksums, the lag, the balancer's C entry, the timeout in ms."""
    step = lb.global_step
    vectors = [lb.sizes[g] for g in range(step, step + lb.lag + 1) if g in lb.sizes]
    return (step, vectors, [checksum(v) for v in vectors], lb.lag, *lb._decisions.balancer.c_decider(),
            int(lb.timeout_s * 1000))


def closed(lb: Any, k: int, now: float) -> None:
    """step() of step k, whose report left from the C++ hook: the work since its barrier noted (one call), then
    the loss check the Python hook makes, the measure it sent and the error it met building the report (which
    travels as the failed flag)."""
    backward, lb._measured_s, error = lb.native.closed(k, now, int(lb.sizes[k][lb.rank]))
    if backward:
        lb.loss.check_scaled(k)
    if error is not None:
        lb._decisions.report_errors[k] = RuntimeError(error)


def decide_step(lb: Any, k: int, now: float) -> bool:
    """step() of step k in one call where it takes its usual course (every step before decided from, the report
    sent by the C++ hook and, with a lag, arrived; no error pending): the work since the barrier noted, every
    rank's rows taken, checked and decided from in C++ (through the balancer's C entry, lbbsp.Balancer.c_decider:
    the sizes of step k+lag+1), step k+1 armed. False: nothing decided, step() goes its general way (the rows stay
    for it)."""
    decisions = lb._decisions
    if decisions.decided != k - 1 or decisions.report_errors:
        return False
    try:
        got = lb.native.decide(k, now, decisions.balancer.iteration, lb.lag)
    except RuntimeError as e:
        raise lb.exchange.failed(k, e) from None
    if got is None:
        return False
    if isinstance(got, str):
        raise decisions.failure(k, lb.lag, got)
    sizes, backward, lb._measured_s, waited = got
    decisions.decided_in_c(k, lb.lag, sizes, waited, time.perf_counter() - now - waited)
    if backward:
        lb.loss.check_scaled(k)
    return True


def make(rank: int, world: int, monitor: Any, group: Any, piggyback_max_bytes: int,
         errors: Dict[int, BaseException], python_reducer: bool = False) -> Any:
    """A NativeStep for this rank's model whose gradients ``group`` reduces, or None where the C++ path does not
    apply (a backend other than gloo, DDP's Python reducer) or does not build. ``monitor``: lbbsp's
    ResourceMonitor (read in C++) or any callable (read with the GIL, as the Python hook does; its errors go to
    ``errors`` by step)."""
    if dist.get_backend(group) != "gloo" or python_reducer:
        return None
    ext = extension()
    if ext is None:
        return None
    layout = [_COLUMN[c] for c in _LAYOUT]
    if isinstance(monitor, ResourceMonitor) and hasattr(monitor.source, "c_sampler"):
        sample_fn, address = monitor.source.c_sampler()
        return ext.NativeStep(rank, world, layout, sample_fn, address, monitor.min_interval_s, piggyback_max_bytes)
    return ext.NativeStep(rank, world, layout, 0, 0, 0.0, piggyback_max_bytes, _exo_reader(monitor, errors))


def _exo_reader(monitor: Callable[[], List[float]], errors: Dict[int, BaseException]) -> Callable:
    """What the C++ hook calls for step k's figures: the checked figures, or None where the monitor raised (its
    error kept for step k, to travel as the report's failed flag and be raised on every rank)."""
    def read(k: int) -> Optional[List[float]]:
        try:
            return read_metrics(monitor)
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, then every rank raises
            errors[k] = e
            return None
    return read


class NativeClock(HostClock):
    """HostClock whose window lives in the C++ step state: the hook closes it and opens the next one."""

    def __init__(self, native: Any) -> None:
        self.native = native
        super().__init__()

    @property
    def recorded_s(self) -> Optional[float]:  # type: ignore[override]
        return self.native.recorded_s

    @recorded_s.setter
    def recorded_s(self, value: Optional[float]) -> None:  # HostClock's restart() sets None: the state does
        pass

    def restart(self, opened: Any = None) -> None:
        self.native.restart(time.perf_counter())

    def reset(self) -> None:
        self.native.reset(time.perf_counter())

    def record(self, seconds: float) -> None:
        self.native.record(seconds)

    def add_wait(self, seconds: float) -> None:
        self.native.add_wait(seconds)

    def add_untimed(self, seconds: float) -> None:
        self.native.add_untimed(seconds)

    def window_s(self, now: float) -> float:
        return self.native.window_s(now)

    def note_work_after_barrier(self, step: int, now: float, batch: int) -> None:
        self.native.note_after_barrier(step, now, batch)

    def measure(self, step: int, batch: int, now: float, ready: Any,
                exo: List[float]) -> Tuple[float, int, List[float]]:
        return self.native.measure(step, batch, now), batch, exo
