"""lbbsp.torch's step path in C++ (lbbsp.torch.native) apart from the DDP runs that exercise it (test_torch_exact
checks which path ran): its clock measures as HostClock, its setting and a failed build. The shared harness is
harness.py."""

import time
import warnings

import numpy as np
import pytest
import torch
from harness import fixed_metrics


@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2, reason="the C++ step path needs PyTorch 2.x's headers")
def test_native_clock_measures_as_the_host_clock(monkeypatch):
    """The same events on the same (fake) clock give the same windows in C++ (lbbsp.torch.native, which the comm
    hook reads at the last bucket) as in HostClock, the Python path's: waits and untimed blocks left out, a
    recorded time, the work after the barrier scaled to a changed batch (within [1/4, 4]), a reset."""
    from lbbsp.torch import native
    from lbbsp.torch.clock import HostClock

    ext = native.extension()
    assert ext is not None, "the C++ step path did not build"
    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    layout = [native._COLUMN[c] for c in native._LAYOUT]
    state = ext.NativeStep(0, 2, layout, 0, 0, 0.0, 1 << 22, fixed_metrics_at_step)
    clocks = {"python": HostClock(), "native": native.NativeClock(state)}  # both open their window at 100.0
    seen = {name: [] for name in clocks}
    for name, clock in clocks.items():
        now[0] = 100.0
        clock.restart()
        now[0] += 0.010
        clock.add_wait(0.002)
        with clock.untimed():
            now[0] += 0.003
        seen[name].append(clock.measure(0, 10, now[0] + 0.005, None, [])[0])
        for k, (before, n) in enumerate([(10, 10), (10, 5), (8, 12), (2, 100), (100, 3)], start=1):
            now[0] += 0.020
            clock.note_work_after_barrier(k - 1, now[0] + 0.004, before)  # step() 4 ms after the barrier
            now[0] += 0.001
            clock.restart()  # the barrier left: the next window
            clock.note_work_after_barrier(k - 1, now[0] + 0.006, before)
            seen[name].append(clock.measure(k, n, now[0] + 0.030, None, [])[0])
        clock.record(0.25)
        clock.record(0.5)
        seen[name].append(clock.recorded_s)
        clock.reset()
        seen[name] += [clock.recorded_s, clock.window_s(now[0] + 0.007)]
    assert np.allclose(seen["native"][:-2], seen["python"][:-2], rtol=0, atol=1e-9), seen
    assert seen["native"][-2:] == seen["python"][-2:], seen
    assert seen["python"][0] == pytest.approx(0.013), seen  # 18 ms less the wait (2) and the untimed block (3)
    assert len(set(np.round(seen["python"][1:6], 9))) >= 4, "the batches changed too little: no scaling checked"


def fixed_metrics_at_step(step):
    return fixed_metrics()


def test_native_path_setting_and_failed_build(monkeypatch):
    """LBBSP_TORCH_NATIVE: a bad value names the variable and its values; a C++ step path that does not build
    warns once (naming the compiler's error) and leaves the Python path, or with =1 raises."""
    from lbbsp.torch import native

    monkeypatch.setenv("LBBSP_TORCH_NATIVE", "yes")
    with pytest.raises(ValueError, match="LBBSP_TORCH_NATIVE must be auto, 0 or 1"):
        native.mode()

    def broken():
        raise RuntimeError("Error building extension:\nnative_step.cpp:9: fatal error: torch/extension.h: No such "
                           "file\nninja: build stopped")
    monkeypatch.setenv("LBBSP_TORCH_NATIVE", "auto")
    if native.mode() == "0":  # PyTorch 1.x: the C++ path is not tried unless =1
        return
    monkeypatch.setattr(native, "_load", broken)
    monkeypatch.setattr(native, "_built", None)
    monkeypatch.setenv("LBBSP_TORCH_NATIVE", "1")
    built = r"LBBSP_TORCH_NATIVE=1 but the C\+\+ step path did not build: native_step.cpp:9: fatal error"
    with pytest.raises(RuntimeError, match=built):
        native.extension()
    monkeypatch.setattr(native, "_built", None)
    monkeypatch.setenv("LBBSP_TORCH_NATIVE", "auto")
    with pytest.warns(UserWarning, match="did not build .*fatal error: torch/extension.h"):
        assert native.extension() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.extension() is None  # once
    monkeypatch.setenv("LBBSP_TORCH_NATIVE", "0")
    assert native.extension() is None
