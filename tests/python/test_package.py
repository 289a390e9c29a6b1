"""The installed Python package `lbbsp` against the C++ core: run by tests/python/run_package_tests.sh on a wheel
installed into a fresh virtual environment (never the source tree). Needs LBBSP_BIN (the lbbsp binary) for the
cross-checks with `lbbsp simulate`."""

import csv
import os
import pickle
import subprocess
from collections import defaultdict

import numpy as np
import pytest

import lbbsp

LBBSP_BIN = os.environ.get("LBBSP_BIN", "")


def test_installed_not_source_tree():
    assert "site-packages" in lbbsp.__file__, lbbsp.__file__
    assert lbbsp.__version__.count(".") == 2


# ---- the binding against `lbbsp simulate` on the same inputs ----


def write_traces(folder, series=4, samples=90):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(11)
    for k in range(series):
        cap = np.clip(np.cumsum(rng.normal(0, 0.15, samples)) % 1.0, 0.05, 1.0)
        with open(os.path.join(folder, f"t{k}.csv"), "w") as f:
            f.write("time_s,capacity\n")
            for t, c in enumerate(cap):
                f.write(f"{t * 60},{c:.3f}\n")


def simulate(tmp_path, profile, balancers, workers=5, iterations=60, global_batch=200, seed=3):
    assert LBBSP_BIN, "set LBBSP_BIN to the lbbsp binary (tests/python/run_package_tests.sh does)"
    traces = tmp_path / "traces"
    write_traces(str(traces))
    batches, reports = tmp_path / f"{profile}-b.csv", tmp_path / f"{profile}-r.csv"
    cmd = [LBBSP_BIN, "simulate", "--workers", str(workers), "--traces", str(traces), "--balancers",
           ",".join(balancers), "--iterations", str(iterations), "--profile", profile, "--seed", str(seed),
           "--global-batch", str(global_batch), "--trace-out", str(batches), "--reports-out", str(reports)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    vectors = defaultdict(list)
    with open(batches) as f:
        for row in csv.DictReader(f):
            vectors[row["balancer"]].append([int(row[f"b{i}"]) for i in range(workers)])
    fed = defaultdict(lambda: defaultdict(list))
    with open(reports) as f:
        for row in csv.DictReader(f):
            fed[row["balancer"]][int(row["iteration"])].append(row)
    return vectors, fed


def replay(name, vectors, fed, workers, global_batch, seed, gpu):
    """Feeds the simulator's reports to lbbsp.Balancer and returns its batch vectors."""
    first = fed[0]
    caps = [int(r["mem_cap"]) for r in first] if gpu else None
    b = lbbsp.Balancer(name, workers=workers, global_batch=global_batch, predictor="ema", seed=seed, num_exo=1,
                       capacity_exo=0, mem_cap=caps)
    out = [b.initial().tolist()]
    for t in range(len(vectors) - 1):
        rows = fed[t]
        cpu = np.array([float(r["cpu_avail"]) for r in rows])
        nxt = b.next(batch=[int(r["batch"]) for r in rows], compute_s=[float(r["compute_s"]) for r in rows],
                     exo=cpu[:, None], mem_cap=[int(r["mem_cap"]) for r in rows], capacity=cpu,
                     capacity_next=[float(r["capacity_next"]) for r in rows])
        assert nxt.dtype == np.int64 and nxt.sum() == global_batch
        out.append(nxt.tolist())
    return out


CPU_BALANCERS = ["bsp", "static:3", "random:5", "lbbsp-cpu:narx", "lbbsp-cpu:ema", "lbbsp-cpu:arima",
                 "lbbsp-cpu:last", "lbbsp-gpu", "lbbsp-gpu-model", "oracle"]


def test_same_batch_vectors_as_simulate_cpu(tmp_path):
    vectors, fed = simulate(tmp_path, "cpu", CPU_BALANCERS)
    assert sorted(vectors) == sorted(CPU_BALANCERS)
    for name in CPU_BALANCERS:
        got = replay(name, vectors[name], fed[name], 5, 200, 3, gpu=False)
        assert got == vectors[name], f"{name}: first difference at iteration " + str(
            next(i for i, (a, c) in enumerate(zip(got, vectors[name])) if a != c))
    # The balancers did balance: the adaptive ones moved away from the equal split.
    assert vectors["lbbsp-cpu:narx"][-1] != vectors["bsp"][-1]


def test_same_batch_vectors_as_simulate_gpu_memory_caps(tmp_path):
    names = ["bsp", "lbbsp-gpu", "lbbsp-gpu-model", "lbbsp-cpu:ema"]
    vectors, fed = simulate(tmp_path, "gpu", names, workers=6, global_batch=192)
    for name in names:
        assert replay(name, vectors[name], fed[name], 6, 192, 3, gpu=True) == vectors[name], name


# ---- sampling ----


M64 = (1 << 64) - 1


def python_permutation(n, seed, epoch):
    """An independent port of the definition (splitmix64 stream, Fisher-Yates from the end)."""
    p = list(range(n))
    state = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 1) & M64
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & M64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        z ^= z >> 31
        j = z % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def test_epoch_permutation_is_lbbsp_trains_order():
    # lbbsp train calls the same C++ function (balancer/sampling.hpp); tests/unit/test_balancer_sampling.cpp pins
    # these values on the C++ side.
    assert lbbsp.epoch_permutation(10, 1, 0).tolist() == [7, 6, 4, 1, 0, 2, 5, 8, 3, 9]
    assert lbbsp.epoch_permutation(12, 7, 3).tolist() == [6, 7, 9, 1, 2, 10, 4, 0, 8, 11, 3, 5]
    for n, seed, epoch in [(1000, 1, 0), (777, 42, 5), (1, 0, 0), (0, 3, 1)]:
        p = lbbsp.epoch_permutation(n, seed, epoch)
        assert p.dtype == np.int64
        assert p.tolist() == python_permutation(n, seed, epoch)


def test_rank_indices_cut_the_global_batch_in_order():
    perm = lbbsp.epoch_permutation(300, 2, 1)
    rng = np.random.default_rng(5)
    for _ in range(30):
        workers = int(rng.integers(1, 6))
        batch = np.bincount(rng.integers(0, workers, 40), minlength=workers)  # zeros included
        step = int(rng.integers(0, lbbsp.steps_per_epoch(300, 40)))
        parts = [lbbsp.rank_indices(perm, step, batch, r) for r in range(workers)]
        assert [len(p) for p in parts] == batch.tolist()
        assert np.concatenate(parts).tolist() == perm[step * 40:(step + 1) * 40].tolist()
        assert [lbbsp.slice_offset(batch, r) for r in range(workers)] == np.cumsum([0, *batch[:-1]]).tolist()


def test_assign_and_check():
    b = lbbsp.assign_by_speed([4.0, 2.0, 1.0, 1.0], 80)
    assert b.tolist() == [40, 20, 10, 10]
    lbbsp.check_batch(b, 80)
    with pytest.raises(ValueError, match="sum"):
        lbbsp.check_batch([40, 20, 10, 9], 80)
    with pytest.raises(ValueError):
        lbbsp.check_batch([40, 20, 10, 10], 80, max=[30, 30, 30, 30])


# ---- state round trips ----


def drive(b, steps, rng, speed):
    sizes = b.initial() if b.iteration == 0 else None
    out = []
    for _ in range(steps):
        t = sizes / (speed * rng.uniform(0.8, 1.2, len(speed)))
        sizes = b.next(batch=sizes, compute_s=t, exo=rng.uniform(0.5, 1.0, (len(speed), 1)))
        out.append(sizes.tolist())
    return sizes, out


@pytest.mark.parametrize("name", ["lbbsp-cpu", "lbbsp-gpu", "lbbsp-gpu-model", "static:4", "random:3", "bsp"])
def test_state_round_trip_continues_identically(name):
    speed = np.array([1000.0, 800.0, 300.0, 100.0])

    def make():
        return lbbsp.Balancer(name, workers=4, global_batch=128, predictor="narx", seed=2, num_exo=1, capacity_exo=0)

    a = make()
    sizes, _ = drive(a, 25, np.random.default_rng(1), speed)
    state, pickled = a.save_state(), pickle.dumps(a)
    rng_a, rng_b, rng_c = (np.random.default_rng(9) for _ in range(3))

    def cont(b, rng):
        out, s = [], sizes
        for _ in range(40):
            t = s / (speed * rng.uniform(0.8, 1.2, 4))
            s = b.next(batch=s, compute_s=t, exo=rng.uniform(0.5, 1.0, (4, 1)))
            out.append(s.tolist())
        return out

    b = make()
    b.load_state(state)
    assert b.iteration == a.iteration
    c = pickle.loads(pickled)
    assert cont(a, rng_a) == cont(b, rng_b) == cont(c, rng_c)


def test_predictor_round_trip_and_prediction():
    p = lbbsp.Predictor("narx", num_exo=1, seed=1)
    rng = np.random.default_rng(3)
    for _ in range(80):
        cap = rng.uniform(0.3, 1.0)
        p.observe(1000.0 * cap, [cap])
    q = pickle.loads(pickle.dumps(p))
    r = lbbsp.Predictor("narx", num_exo=1, seed=1)
    r.load_state(p.save_state())
    for _ in range(20):  # the copies continue identically
        cap = rng.uniform(0.3, 1.0)
        guesses = {x.predict([cap]) for x in (p, q, r)}
        assert len(guesses) == 1 and 0 < guesses.pop() < float("inf")
        for x in (p, q, r):
            x.observe(1000.0 * cap, [cap])
    e = lbbsp.Predictor("ema:0.5")
    e.observe(100.0)
    e.observe(200.0)
    assert e.predict() == pytest.approx(150.0)


def test_predicted_speeds():
    b = lbbsp.Balancer("lbbsp-cpu", workers=3, global_batch=110, predictor="last")
    sizes = b.next(batch=[30, 30, 30], compute_s=[0.1, 0.2, 0.3])
    assert b.predicted_speeds() == pytest.approx([300.0, 150.0, 100.0])
    assert sizes.tolist() == [60, 30, 20]  # finish together at 0.2 s
    assert lbbsp.Balancer("bsp", workers=3, global_batch=90).predicted_speeds().size == 0


def test_noise_band_follows_the_misses():
    """lbbsp-cpu's noise_band(): 0 while its predictions are exact, the RMS of the workers' relative misses
    (log of measured / predicted speed, less their mean) after a step that missed; 0 for balancers without one."""
    b = lbbsp.Balancer("lbbsp-cpu", workers=2, global_batch=100, predictor="last")
    for _ in range(3):
        b.next(batch=[50, 50], compute_s=[0.5, 0.5])
    assert b.noise_band() == pytest.approx(0.0, abs=1e-9)
    b.next(batch=[50, 50], compute_s=[0.5, 0.25])  # worker 1 twice as fast as predicted: misses 0 and log 2
    assert b.noise_band() == pytest.approx(np.log(2) / 2)
    assert lbbsp.Balancer("bsp", workers=2, global_batch=100).noise_band() == 0.0


# ---- one wheel, one decision: the same balancer decisions on a CPU without AVX-512 (qemu-user) ----

_REPLAY = """
import hashlib, numpy as np, lbbsp
try:
    from numpy._core._multiarray_umath import __cpu_features__ as cpu
except ImportError:
    from numpy.core._multiarray_umath import __cpu_features__ as cpu
rng = np.random.default_rng(3)
W, X, T = 6, 384, 80
cap = np.clip(0.3 + 0.7 * rng.random((T, W)), 0.05, 1.0)
digest = hashlib.sha256()
for name in ["lbbsp-cpu:narx", "lbbsp-cpu:arima", "lbbsp-cpu:ema", "lbbsp-gpu", "oracle", "random:5"]:
    b = lbbsp.Balancer(name, workers=W, global_batch=X, seed=1, num_exo=3, capacity_exo=0)
    sizes = b.initial()
    for t in range(T - 1):
        exo = np.stack([cap[t], np.full(W, 0.8), np.full(W, 0.1)], axis=1)
        sizes = b.next(batch=sizes, compute_s=(sizes + 1) * 0.001 / cap[t], exo=exo, capacity=cap[t],
                       capacity_next=cap[t + 1])
        digest.update(sizes.tobytes())
print(bool(cpu.get("AVX512F")), digest.hexdigest())
"""


def test_same_decisions_on_a_cpu_without_avx512():
    """The wheel (-march=x86-64-v3) decides alike on this CPU and on qemu-user's emulated x86-64 with AVX2 but no
    AVX-512 (an older node): 6 balancers, 79 decisions each. qemu-user comes from scripts/setup.sh."""
    import sys
    native = subprocess.run([sys.executable, "-c", _REPLAY], capture_output=True, text=True, check=True)
    emulated = subprocess.run(["qemu-x86_64", "-cpu", "max", sys.executable, "-c", _REPLAY], capture_output=True,
                              text=True, check=True, timeout=600)
    avx512, digest = emulated.stdout.split()
    assert avx512 == "False", "qemu's CPU should have no AVX-512 for this test to mean something"
    assert native.stdout.split()[1] == digest, (native.stdout, emulated.stdout)


# ---- one table of names: the package reads them, and the /proc monitor, from the C++ core ----


def test_names_come_from_the_core():
    from lbbsp import _lbbsp
    assert lbbsp.BALANCERS == tuple(_lbbsp.balancer_kinds()) and lbbsp.PREDICTORS == tuple(_lbbsp.predictor_kinds())
    for name in lbbsp.BALANCERS:  # every listed kind builds with its default arguments
        assert lbbsp.Balancer(name, workers=2, global_batch=8).initial().sum() == 8
    for name in lbbsp.PREDICTORS:
        lbbsp.Predictor(name, num_exo=len(lbbsp.RANK_EXO))
    # What `lbbsp train` writes in telemetry and lbbsp.torch sends in its reports, in this order.
    assert lbbsp.RANK_EXO == ("cpu_avail", "mem_avail", "load") and lbbsp.RANK_CAPACITY_EXO == 0


def _pin(cpus):
    os.sched_setaffinity(0, cpus)


def test_monitor_sees_another_process_on_the_pinned_cpu():
    from lbbsp import _lbbsp
    cpus = sorted(os.sched_getaffinity(0))
    try:
        _pin({cpus[0]})
        m = _lbbsp.ResourceMonitor()
        m.sample()
        pid = os.fork()
        if pid == 0:  # the co-tenant: spins on our CPU for 0.4 s of its own CPU time
            while os.times().user + os.times().system < 0.4:
                pass
            os._exit(0)
        os.waitpid(pid, 0)
        cpu, mem, load = m.sample()
        assert cpu < 0.5, cpu
        assert 0 < mem <= 1 and load >= 0, (mem, load)
    finally:
        _pin(set(cpus))


# ---- bad input: an exception naming the argument, never a crash ----


def test_bad_names():
    with pytest.raises(ValueError, match="unknown balancer 'fastest'"):
        lbbsp.Balancer("fastest", workers=2, global_batch=8)
    with pytest.raises(ValueError, match="unknown predictor 'prophet'"):
        lbbsp.Balancer("lbbsp-cpu", workers=2, global_batch=8, predictor="prophet")
    with pytest.raises(ValueError, match="narx option 'depth'"):
        lbbsp.Predictor("narx:depth=3")
    with pytest.raises(ValueError, match="static"):
        lbbsp.Balancer("static:zero", workers=2, global_batch=8)
    with pytest.raises(TypeError, match="balancer must be a string"):
        lbbsp.Balancer(3, workers=2, global_batch=8)


def test_bad_config_values():
    with pytest.raises(ValueError, match="workers must be >= 1"):
        lbbsp.Balancer("bsp", workers=0, global_batch=8)
    with pytest.raises(ValueError, match="min batch"):
        lbbsp.Balancer("bsp", workers=4, global_batch=8, min_batch=3)
    with pytest.raises(ValueError, match="capacity_exo"):
        lbbsp.Balancer("lbbsp-cpu", workers=4, global_batch=8, num_exo=1, capacity_exo=1)
    with pytest.raises(ValueError, match="mem_cap must have one entry per worker"):
        lbbsp.Balancer("bsp", workers=4, global_batch=8, mem_cap=[4, 4])
    with pytest.raises(TypeError, match="global_batch must be an integer"):
        lbbsp.Balancer("bsp", workers=4, global_batch=8.5)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"batch": [16, 16, 16]}, ValueError, "batch must have one entry per worker"),
    ({"batch": np.array([16.0, 16, 16, 16])}, TypeError, "batch must be an array of integers"),
    ({"batch": ["a", "b", "c", "d"]}, TypeError, "batch must be an array of integers"),
    ({"batch": [[16, 16, 16, 16]]}, ValueError, "batch must be one-dimensional"),
    ({"batch": [20, 20, 30, -6]}, ValueError, "batch must be >= 0"),
    ({"compute_s": [0.1, float("nan"), 0.1, 0.1]}, ValueError, "compute_s must be finite and >= 0, got nan at index 1"),
    ({"compute_s": [0.1, 0.1, -0.2, 0.1]}, ValueError, "compute_s must be finite and >= 0"),
    ({"compute_s": [0.1, 0.1, float("inf"), 0.1]}, ValueError, "compute_s must be finite"),
    ({"compute_s": [0.1, 0.1]}, ValueError, r"compute_s must have shape \(4\)"),
    ({"compute_s": ["x"] * 4}, TypeError, "compute_s must be an array of real numbers"),
    ({"exo": np.ones((4, 2))}, ValueError, r"exo must have shape \(4, 1\)"),
    ({"exo": None}, ValueError, "exo is required"),
    ({"mem_cap": [1, 2]}, ValueError, "mem_cap must have one entry per worker"),
])
def test_bad_reports(kwargs, error, match):
    b = lbbsp.Balancer("lbbsp-cpu", workers=4, global_batch=64, predictor="ema", num_exo=1, capacity_exo=0)
    report = {"batch": [16, 16, 16, 16], "compute_s": [0.1, 0.1, 0.2, 0.4], "exo": np.ones((4, 1))}
    report.update(kwargs)
    with pytest.raises(error, match=match):
        b.next(**report)
    assert b.iteration == 0  # a refused report changes nothing
    assert b.next(batch=[16] * 4, compute_s=[0.1, 0.1, 0.2, 0.4], exo=np.ones((4, 1))).sum() == 64


def test_bad_states():
    cpu = lbbsp.Balancer("lbbsp-cpu", workers=2, global_batch=8, predictor="ema")
    gpu = lbbsp.Balancer("lbbsp-gpu", workers=2, global_batch=8)
    with pytest.raises(ValueError, match="does not fit balancer 'lbbsp-gpu'"):
        gpu.load_state(cpu.save_state())
    with pytest.raises(ValueError, match="not from lbbsp.Balancer.save_state"):
        gpu.load_state(b"garbage")
    with pytest.raises(TypeError, match="state must be bytes"):
        gpu.load_state("text")
    narx = lbbsp.Balancer("lbbsp-cpu", workers=2, global_batch=8, predictor="narx")
    with pytest.raises(ValueError):
        narx.load_state(cpu.save_state())  # same balancer, another predictor
    rng = np.random.default_rng(0)
    good = narx.save_state()
    for _ in range(50):  # cut or scrambled states: an exception, never a crash
        cut = good[:int(rng.integers(0, len(good)))]
        with pytest.raises(ValueError):
            narx.load_state(cut)
    with pytest.raises(ValueError):
        lbbsp.Predictor("ema").load_state(lbbsp.Predictor("last").save_state())


def test_bad_sampling_arguments():
    perm = lbbsp.epoch_permutation(100, 1, 0)
    with pytest.raises(ValueError, match="n must be >= 0"):
        lbbsp.epoch_permutation(-5, 1, 0)
    with pytest.raises(ValueError, match="runs past"):
        lbbsp.rank_indices(perm, 3, [30, 20], 0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        lbbsp.rank_indices(perm, 0, [30, 20], 2)
    with pytest.raises(TypeError, match="permutation must be an array of integers"):
        lbbsp.rank_indices(perm.astype(float), 0, [30, 20], 0)
    with pytest.raises(ValueError, match="global_batch must be >= 1"):
        lbbsp.steps_per_epoch(100, 0)
    with pytest.raises(TypeError, match="seed must be an integer"):
        lbbsp.epoch_permutation(10, "1", 0)

