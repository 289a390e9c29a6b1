"""lbbsp.torch on real gloo process groups (torch.multiprocessing, one thread per rank): exact aggregation against
one process (a summed loss; a mean loss with an L2 term through lb.scale; an HDF5 DataLoader with workers, resumed
mid-epoch), identical sizes everywhere, 0-sample ranks, a rank slowed in loading, forward or after backward gets
fewer samples, resume from state_dict, DataLoader with workers and lag, the unscaled-loss warning, bad arguments,
an exception on one rank ending all with it named, a hung rank named by the others' timeout, init_from_env's
timeout, and a portable extension."""

import contextlib
import datetime
import gc
import itertools
import os
import pickle
import time
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import lbbsp
from lbbsp.torch import LoadBalancer

with contextlib.suppress(ImportError):  # PyTorch 2.x: DDP's constructor imports it; the forked ranks inherit it
    import torch._dynamo

N, DIM, CLASSES = 240, 12, 4
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def data():
    g = np.random.default_rng(0)
    x = torch.from_numpy(g.normal(size=(N, DIM)))
    y = torch.from_numpy(g.integers(0, CLASSES, N))
    return x, y


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES)).double()


def init(rank, world, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))


_STORES = itertools.count()


def finish():
    """Ends a worker as a training script does: the process group destroyed, the rank returns (a forked rank then
    leaves through os._exit, multiprocessing's own; a spawned one through the interpreter's shutdown, which
    test_endings.py repeats)."""
    dist.destroy_process_group()


def resolved_start_method(asked="fork"):
    """How the ranks start: as asked (fork by default, see spawn()), but spawned where torch sees a GPU: there a
    backward in this process (one_process's reference) starts autograd's device threads, and a forked rank's
    backward then fails ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing", seen on an H200). LBBSP_TEST_START_METHOD=spawn|fork|forkserver overrides both."""
    if os.environ.get("LBBSP_TEST_START_METHOD"):
        return os.environ["LBBSP_TEST_START_METHOD"]
    return "spawn" if asked == "fork" and torch.cuda.is_available() else asked


def spawn(fn, world, tmp_path, *args, start_method="fork"):
    """Runs fn(rank, world, store, out, *args) in `world` forked processes. Forked, not spawned: a spawned rank
    imports torch again and, on PyTorch 2.x, DDP's constructor imports torch._dynamo (~2 s each); imported once
    at the top of this module, every rank starts at once. The ranks call torch.set_num_threads(1) first (init),
    so they never enter the OpenMP pool this process may have used. start_method="spawn" for ranks that use
    CUDA (which a forked child cannot initialise where its parent has)."""
    store = tmp_path / f"store-{fn.__name__}-{world}-{next(_STORES)}"  # a fresh FileStore per spawn: workers
    # that end with os._exit leave theirs behind
    ranks = mp.start_processes(fn, args=(world, str(store), str(tmp_path), *args), nprocs=world, join=False,
                               start_method=resolved_start_method(start_method))
    # A hang guard, not a timing: ranks that are still running after this long (a few seconds is the norm) hang,
    # and the test says so and which, instead of the whole CTest test timing out without a name.
    hang_s = float(os.environ.get("LBBSP_TEST_HANG_S", "600"))
    deadline = time.monotonic() + hang_s
    while not ranks.join(timeout=1.0):
        if time.monotonic() > deadline:
            alive = [r for r, p in enumerate(ranks.processes) if p.is_alive()]
            for p in ranks.processes:
                p.kill()
            pytest.fail(f"{fn.__name__}: ranks {alive} of {world} still running after {hang_s:.0f} s "
                        "(LBBSP_TEST_HANG_S): a hang")


def write_pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def read_pickle(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def dump_rank(out, name, rank, result):
    """A worker's result, one pickle per rank (read back with load_ranks)."""
    write_pickle(os.path.join(out, f"{name}-{rank}.pkl"), result)


def load_ranks(tmp_path, name, world):
    return [read_pickle(tmp_path / f"{name}-{r}.pkl") for r in range(world)]


def flat_params(module):
    """A module's parameters as one NumPy vector."""
    return torch.cat([p.detach().flatten() for p in module.parameters()]).numpy()


def fixed_metrics():
    return [1.0, 0.5, 0.0]


# ---- exactness: DDP + SUM hook == one process on the same global batches ----


def _exact_worker(rank, world, store, out, steps, global_batch, piggyback=True, lag=0, compile_backend=None,
                  ddp_options=None):
    init(rank, world, store)
    if not piggyback:  # the reports in the control group's all-gather, as for a large or half-precision bucket
        lbbsp.torch.exchange.ReportExchange.PIGGYBACK_MAX_BYTES = 0
    x, y = data()
    model = DDP(make_model(), **(ddp_options or {}))
    lb = LoadBalancer(model, dataset_size=N, global_batch=global_batch, balancer="random:5", seed=3,
                      monitor=fixed_metrics, lag=lag)
    forward = model if compile_backend is None else torch.compile(model, backend=compile_backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sizes = []
    for g in range(steps):
        epoch, step = divmod(g, lb.steps_per_epoch)
        idx = torch.from_numpy(lb.indices(epoch, step))
        sizes.append(lb.batch_sizes.tolist())
        loss = lb.scale(F.cross_entropy(forward(x[idx]), y[idx], reduction="sum"), reduction="sum")
        loss.backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    params = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy()
    np.save(os.path.join(out, f"exact-{world}-{rank}.npy"), params)
    # Which way the reports travelled, and how many piggyback buffers that took (reused once read).
    paths = {"rides": lb._exchange.rides, "gathers": lb._exchange.gathers, "buffers": lb._exchange.buffers_made}
    if compile_backend is not None:  # frames dynamo compiled (else the model ran eagerly and proved nothing)
        paths["compiled"] = torch._dynamo.utils.counters["frames"]["ok"]
    write_pickle(os.path.join(out, f"sizes-{world}-{rank}.pkl"), (sizes, paths))
    finish()


def one_process(steps, global_batch, seed=3, l2=0.0, mean=False, momentum=0.9):
    """One process on the same global batches: the summed loss / X, or (mean=True) the mean loss + l2 x the
    squared parameters."""
    x, y = data()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    per_epoch = lbbsp.steps_per_epoch(N, global_batch)
    for g in range(steps):
        epoch, step = divmod(g, per_epoch)
        idx = torch.from_numpy(lbbsp.epoch_permutation(N, seed, epoch)[step * global_batch:(step + 1) * global_batch])
        if mean:
            loss = F.cross_entropy(model(x[idx]), y[idx]) + l2 * _l2(model)
        else:
            loss = F.cross_entropy(model(x[idx]), y[idx], reduction="sum") / global_batch
        loss.backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()


def assert_equal_to_one_process(ref, rank_files):
    """Each rank's saved parameters (one .npy per rank, in rank order) equal one process's to 1e-10 relative."""
    for r, f in enumerate(rank_files):
        got = np.load(f)
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r}: relative difference {rel:.3g} from one process"


def assert_random5_equals_one_process(got, sizes, world=3, global_batch=24):
    """Ranks under a framework (Lightning, Accelerate; 3 by default), random:5 over 2 epochs of 240 samples: every
    step's sizes agreed on by every rank, some rank given 0 samples, every rank's parameters equal to one
    process's to 1e-10."""
    steps = 2 * (N // global_batch)
    assert sizes.shape == (steps, world) and (sizes.sum(axis=1) == global_batch).all(), sizes
    assert all(g["sizes"] == got[0]["sizes"] for g in got), "the ranks disagree on the sizes"
    assert (sizes == 0).any(), "random:5 gave no 0-sample rank: the test lost its point"
    ref = one_process(steps, global_batch, mean=True)
    for r, g in enumerate(got):
        rel = np.linalg.norm(g["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r}: relative difference {rel:.3g} from one process"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reports_riding_in_a_gradient_bucket_are_exact(dtype):
    """The report block appended to the last bucket: summed over 3 ranks it gives every report back exactly,
    the CRC-32 included (two 16-bit halves: float32 holds integers to 2^24)."""
    from lbbsp.torch.exchange import CHECKSUM, REPORT, read_rows, write_row
    reports = np.array([[r * 100 + k + 0.25 for k in range(REPORT)] for r in range(3)])
    reports[:, CHECKSUM] = [0xFFFFFFFF, 0x80000001, 12345]
    blocks = [torch.full((3, REPORT + 1), 7.0, dtype=dtype) for _ in range(3)]  # stale values: write_row zeros them
    for r, block in enumerate(blocks):
        write_row(block.numpy(), r, reports[r])
    summed = sum(blocks)
    assert summed.dtype == dtype
    np.testing.assert_array_equal(read_rows(summed.numpy()), reports)


def test_monitor_is_the_runtimes():
    """lbbsp.torch measures with the C++ runtime's /proc monitor (the same code as `lbbsp train`)."""
    m = lbbsp.torch.ResourceMonitor()
    assert isinstance(m._monitor, lbbsp._lbbsp.ResourceMonitor)
    cpu, mem, load = m.sample()
    assert 0 <= cpu <= 1 and 0 < mem <= 1 and load >= 0, (cpu, mem, load)


def test_monitor_reads_proc_at_most_every_min_interval(monkeypatch):
    """Samples closer than min_interval_s repeat the last read (/proc costs ~70 us; its CPU figures move in 10 ms
    ticks); one at the interval reads again."""
    m = lbbsp.torch.ResourceMonitor(min_interval_s=0.01)
    reads = []

    class Proc:
        def sample(self):
            reads.append(len(reads))
            return [1.0, 0.5, float(len(reads))]
    m._monitor = Proc()
    clock = iter([100.0, 100.004, 100.0099, 100.0101, 100.0202])
    monkeypatch.setattr(lbbsp.torch.monitor, "_clock", lambda: next(clock))
    got = [m.sample()[2] for _ in range(5)]
    assert got == [1.0, 1.0, 1.0, 2.0, 3.0], got


@pytest.mark.parametrize("world, piggyback, lag", [(2, True, 0), (3, True, 0), (4, True, 0), (16, True, 0),
                                                   (3, False, 0), (3, True, 2)])
def test_exact_against_one_process(tmp_path, world, piggyback, lag):
    """Every rank's parameters equal one process's, the sizes agree; with lag 2 too (reports taken as they
    arrive, the decision two steps ahead)."""
    steps, X = 20, 24  # 10 steps per epoch: two epochs
    spawn(_exact_worker, world, tmp_path, steps, X, piggyback, lag)
    ref = one_process(steps, X)
    got = [read_pickle(tmp_path / f"sizes-{world}-{r}.pkl") for r in range(world)]
    sizes, paths = [g[0] for g in got], [g[1] for g in got]
    # Every step's reports went the way asked: a silent fall-back to the all-gather would cost a collective.
    want = {"rides": steps, "gathers": 0} if piggyback else {"rides": 0, "gathers": steps}
    assert all({k: p[k] for k in want} == want for p in paths), paths
    # The piggyback buffer is reused, not made each step: one, and one more when DDP rebuilds its buckets after
    # step 0 (with DDP a ride has arrived when backward() returns, so step() reads it and frees its buffer).
    assert all(p["buffers"] <= (2 if piggyback else 0) for p in paths), paths
    assert all(s == sizes[0] for s in sizes), "ranks disagree on the batch sizes"
    flat = np.array(sizes[0])
    assert (flat.sum(axis=1) == X).all()
    assert (flat == 0).any(), "random:5 gave no 0-sample rank: the test lost its point"
    assert len({tuple(r) for r in flat.tolist()}) > 5, "the split hardly changed"
    assert_equal_to_one_process(ref, [tmp_path / f"exact-{world}-{r}.npy" for r in range(world)])


@pytest.mark.parametrize("options", [dict(gradient_as_bucket_view=True), dict(static_graph=True),
                                     dict(find_unused_parameters=True), dict(bucket_cap_mb=0.0001)],
                         ids=["bucket_view", "static_graph", "find_unused", "tiny_buckets"])
def test_ddp_options_keep_exactness(tmp_path, options):
    """DDP's options that users set (gradients as views of the buckets, a static graph, unused parameters searched,
    a bucket per parameter): the hook sees every bucket, the report rides in the last one, exact."""
    spawn(_exact_worker, 3, tmp_path, 20, 24, True, 0, None, options)
    got = [read_pickle(tmp_path / f"sizes-3-{r}.pkl") for r in range(3)]
    assert all(g[1]["rides"] == 20 and g[1]["gathers"] == 0 for g in got), [g[1] for g in got]
    assert all(g[0] == got[0][0] for g in got), "ranks disagree on the batch sizes"
    assert_equal_to_one_process(one_process(20, 24), [tmp_path / f"exact-3-{r}.npy" for r in range(3)])


def test_one_rank_is_one_process(tmp_path):
    """torchrun --nproc_per_node 1 (a first try, a debug run): the whole batch, the report riding, exact."""
    spawn(_exact_worker, 1, tmp_path, 20, 24)
    sizes, paths = read_pickle(tmp_path / "sizes-1-0.pkl")
    assert sizes == [[24]] * 20 and paths["rides"] == 20, (sizes, paths)
    assert_equal_to_one_process(one_process(20, 24), [tmp_path / "exact-1-0.npy"])


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile is PyTorch 2.x (python.torch2 runs this)")
def test_compiled_model_is_exact(tmp_path):
    """torch.compile over the DDP model (dynamo splits its graph at DDP's buckets; the batch size changes every
    step): the hook still sees every bucket, the reports ride in the last one, every rank equals one process."""
    steps, X = 20, 24
    spawn(_exact_worker, 3, tmp_path, steps, X, True, 0, "aot_eager")
    got = [read_pickle(tmp_path / f"sizes-3-{r}.pkl") for r in range(3)]
    assert all(g[1]["rides"] == steps and g[1]["gathers"] == 0 and g[1]["compiled"] > 0 for g in got), \
        [g[1] for g in got]
    assert all(g[0] == got[0][0] for g in got), "ranks disagree on the batch sizes"
    assert len({tuple(r) for r in got[0][0]}) > 5, "the split hardly changed"
    assert_equal_to_one_process(one_process(steps, X), [tmp_path / f"exact-3-{r}.npy" for r in range(3)])


# ---- a slowed rank gets fewer samples ----


def _slow_worker(rank, world, store, out):
    init(rank, world, store)
    lb = LoadBalancer(None, dataset_size=4000, global_batch=64, balancer="lbbsp-cpu", predictor="ema", seed=1,
                      monitor=fixed_metrics)
    for g in range(25):
        idx = lb.indices(*divmod(g, lb.steps_per_epoch))
        time.sleep(len(idx) * (2e-4 if rank != world - 1 else 1e-3))  # the last rank is 5x slower
        lb.step()
    if rank == 0:
        np.save(os.path.join(out, "slow.npy"), lb.batch_sizes)
    finish()


def test_slowed_rank_gets_fewer_samples(tmp_path):
    spawn(_slow_worker, 3, tmp_path)
    sizes = np.load(tmp_path / "slow.npy")
    assert sizes.sum() == 64
    assert sizes[2] < 0.5 * min(sizes[0], sizes[1]), sizes


# ---- every balancer and predictor of the C++ side runs through LoadBalancer, alike on every rank ----

BALANCERS = [("bsp", "narx"), ("static:3", "narx"), ("random:4", "narx"), ("lbbsp-gpu", "narx"),
             ("lbbsp-gpu-model", "narx")] + [("lbbsp-cpu", p) for p in ("narx", "arima", "ema", "last")]


def _every_balancer_worker(rank, world, store, out):
    init(rank, world, store)
    got = {}
    for balancer, predictor in BALANCERS:
        lb = LoadBalancer(None, dataset_size=2000, global_batch=60, balancer=balancer, predictor=predictor,
                          seed=2, monitor=fixed_metrics)
        sizes = []
        for _g in range(30):
            sizes.append(lb.batch_sizes.tolist())
            lb.record_compute(1e-3 * lb.batch_sizes[rank] * (3.0 if rank == world - 1 else 1.0))  # last rank 3x
            lb.step()
        got[f"{balancer}/{predictor}"] = sizes
    dump_rank(out, "every", rank, got)
    finish()


def test_every_balancer_runs_alike_on_every_rank(tmp_path):
    spawn(_every_balancer_worker, 3, tmp_path)
    got = load_ranks(tmp_path, "every", 3)
    assert got[1] == got[0] and got[2] == got[0], "the ranks decided different sizes"
    for name, sizes in got[0].items():
        sizes = np.array(sizes)
        assert (sizes.sum(axis=1) == 60).all() and (sizes >= 0).all(), (name, sizes)
        last = sizes[-1]
        if name.startswith("bsp"):
            assert (sizes == 20).all(), (name, sizes)
        elif name.startswith("random"):
            assert len({tuple(s) for s in sizes}) > 10, (name, sizes)
        else:  # every balancer that measures gives the rank 3x slower fewer samples than the others
            assert last[2] < 0.6 * min(last[0], last[1]), (name, sizes[-5:])


# ---- resume from state_dict continues identically ----


def _resume_worker(rank, world, store, out, phase):
    init(rank, world, store)
    lb = LoadBalancer(None, dataset_size=1000, global_batch=40, balancer="lbbsp-cpu", predictor="narx", seed=2,
                      lag=1, monitor=fixed_metrics)
    speed = [1000.0, 400.0][rank]
    start = 0
    if phase != "first":
        state = torch.load(os.path.join(out, "lb.pt"))
        if phase == "resume_v2":  # a state saved before version 3: the sizes keyed by step
            state["version"], state["sizes"] = 2, {state["step"] + i: v for i, v in enumerate(state["sizes"])}
        lb.load_state_dict(state)
        start = lb.global_step
    seen = []
    for g in range(start, 30):
        seen.append(lb.batch_sizes.tolist())
        lb.record_compute(lb.batch_sizes[rank] / speed * (1 + 0.1 * np.sin(g + rank)))
        lb.step()
        if phase == "first" and g == 11 and rank == 0:
            torch.save(lb.state_dict(), os.path.join(out, "lb.pt"))
    if rank == 0:
        write_pickle(os.path.join(out, f"resume-{phase}.pkl"), seen)
    finish()


def test_resume_continues_identically(tmp_path):
    spawn(_resume_worker, 2, tmp_path, "first")
    first = read_pickle(tmp_path / "resume-first.pkl")
    for phase in ("resume", "resume_v2"):
        spawn(_resume_worker, 2, tmp_path, phase)
        resumed = read_pickle(tmp_path / f"resume-{phase}.pkl")
        assert len(resumed) == 18
        assert first[12:] == resumed, phase
    assert first[-1][0] > first[-1][1], "the faster rank should carry more"


# ---- DataLoader with workers and lag ----


def _loader_worker(rank, world, store, out, lag, workers):
    init(rank, world, store)
    x, y = data()
    ds = torch.utils.data.TensorDataset(x, y)
    lb = LoadBalancer(None, dataset_size=N, global_batch=24, balancer="random:9", seed=4, min_batch=1, lag=lag,
                      monitor=fixed_metrics)
    got = []
    try:
        for epoch in range(2):
            loader = torch.utils.data.DataLoader(ds, batch_sampler=lb.batch_sampler(epoch), num_workers=workers,
                                                 prefetch_factor=1)
            for step, (xb, yb) in enumerate(loader):
                want = torch.from_numpy(lb.indices(epoch, step))
                assert torch.equal(xb, x[want]) and torch.equal(yb, y[want])
                got.append(len(want))
                lb.record_compute(1e-3 * len(want))
                lb.step()
        result = got
    except RuntimeError as e:
        result = str(e)
    write_pickle(os.path.join(out, f"loader-{lag}-{workers}-{rank}.pkl"), result)
    finish()


def test_dataloader_with_workers_and_lag(tmp_path):
    spawn(_loader_worker, 2, tmp_path, 2, 2)  # 2 workers x prefetch 1 = 2 batches ahead: lag 2
    counts = [read_pickle(tmp_path / f"loader-2-2-{r}.pkl") for r in range(2)]
    assert all(isinstance(c, list) and len(c) == 20 for c in counts), counts
    assert all(a + b == 24 for a, b in zip(*counts))
    spawn(_loader_worker, 2, tmp_path, 1, 1)  # 1 worker: lag 1
    assert isinstance(read_pickle(tmp_path / "loader-1-1-0.pkl"), list)
    spawn(_loader_worker, 2, tmp_path, 0, 2)  # prefetching past what is decided: a clear error
    msg = read_pickle(tmp_path / "loader-0-2-0.pkl")
    assert isinstance(msg, str) and "lag >= P" in msg, msg


# ---- bad arguments: a clear exception on every rank ----


def _bad_args_worker(rank, world, store, out):
    init(rank, world, store)
    cases = {
        "balancer": dict(dataset_size=100, global_batch=10, balancer="fastest"),
        "predictor": dict(dataset_size=100, global_batch=10, predictor="prophet"),
        "global_batch": dict(dataset_size=100, global_batch=0),
        "too_big": dict(dataset_size=100, global_batch=200),
        "lag": dict(dataset_size=100, global_batch=10, lag=-1),
        "timeout": dict(dataset_size=100, global_batch=10, timeout_s=0),
        "timeout_bool": dict(dataset_size=100, global_batch=10, timeout_s=True),
        "model": dict(dataset_size=100, global_batch=10, model=torch.nn.Linear(2, 2)),
    }
    if TORCH2:  # FSDP on the CPU, both APIs where there are two (fully_shard: PyTorch 2.6 and later)
        from torch.distributed import fsdp
        cases["fsdp1"] = dict(dataset_size=100, global_batch=10, model=fsdp.FullyShardedDataParallel(
            torch.nn.Linear(2, 2), device_id=torch.device("cpu")))
        if hasattr(fsdp, "fully_shard"):
            cases["fsdp2"] = dict(dataset_size=100, global_batch=10, model=fsdp.fully_shard(torch.nn.Linear(2, 2)))
    hooked = DDP(make_model())  # a hook of the user's already there: DDP takes one
    hooked.register_comm_hook(None, lambda state, bucket: dist.all_reduce(bucket.buffer(), async_op=True)
                              .get_future().then(lambda f: f.value()[0]))
    cases["hooked"] = dict(dataset_size=100, global_batch=10, model=hooked)
    messages = {}
    for name, kw in cases.items():
        model = kw.pop("model", None)
        try:
            LoadBalancer(model, **kw)
            messages[name] = "no error"
        except (ValueError, TypeError, RuntimeError) as e:
            messages[name] = f"{type(e).__name__}: {e}"
    lb = LoadBalancer(None, dataset_size=100, global_batch=10, monitor=fixed_metrics)
    messages["default_timeout_s"] = lb.timeout_s
    try:
        lb.indices(0, 10)
    except ValueError as e:
        messages["step"] = str(e)
    write_pickle(os.path.join(out, f"bad-{rank}.pkl"), messages)
    finish()


def test_bad_arguments_raise_on_every_rank(tmp_path):
    spawn(_bad_args_worker, 2, tmp_path)
    m0, m1 = (read_pickle(tmp_path / f"bad-{r}.pkl") for r in range(2))
    assert m0 == m1
    assert "unknown balancer 'fastest'" in m0["balancer"]
    assert "unknown predictor 'prophet'" in m0["predictor"]
    assert "global_batch must be >= 1" in m0["global_batch"]
    assert "exceeds dataset_size" in m0["too_big"]
    assert "lag must be >= 0" in m0["lag"]
    assert "timeout_s must be a positive" in m0["timeout"] and "timeout_s must be" in m0["timeout_bool"]
    # By default a long phase on one rank between steps may last as long as a PyTorch collective may wait.
    assert m0["default_timeout_s"] == dist.default_pg_timeout.total_seconds() == 1800.0
    assert "must be a DistributedDataParallel" in m0["model"]
    assert m0["hooked"].startswith("RuntimeError: LoadBalancer: the model already has a communication hook"), \
        m0["hooked"]
    assert "fsdp1" in m0 or not TORCH2
    for fsdp in [k for k in m0 if k.startswith("fsdp")]:
        assert m0[fsdp].startswith("TypeError: LoadBalancer: FSDP (FullyShardedDataParallel, fully_shard) is not "
                                   "supported"), m0[fsdp]
    assert "past the epoch's 10 steps" in m0["step"]


def _mismatch_worker(rank, world, store, out):
    init(rank, world, store)
    pair = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]  # every process enters every new_group
    cases = {  # each a LoadBalancer's arguments on this rank
        "shard": dict(model=None, dataset_size=N // 4 if rank == 1 else N, global_batch=24),  # a shard's length
        "seed": dict(model=None, dataset_size=N, global_batch=24, seed=rank),
        "model_group": dict(model=DDP(make_model()), dataset_size=N, global_batch=24, process_group=pair),
    }
    on_some = DDP(make_model())  # built by every process (a collective), handed over by ranks 1-3 only
    cases["model_on_some"] = dict(model=on_some if rank else None, dataset_size=N, global_batch=24)
    messages = {}
    for name, kwargs in cases.items():
        try:
            LoadBalancer(monitor=fixed_metrics, timeout_s=30, **kwargs)
            messages[name] = "built"
        except ValueError as e:
            messages[name] = str(e)
    dump_rank(out, "mismatch", rank, messages)
    finish()


def test_ranks_built_alike_or_every_rank_raises(tmp_path):
    spawn(_mismatch_worker, 4, tmp_path)
    got = load_ranks(tmp_path, "mismatch", 4)
    assert got[0] == got[1] and got[2] == got[3], "the ranks of one group said different things"
    m = got[0]
    same = [{k: v for k, v in g.items() if k != "model_group"} for g in (m, got[2])]  # that one names the pair
    assert same[0] == same[1]
    assert m["shard"].startswith("LoadBalancer: the ranks were built with different dataset_size: 240 on ranks 0, "
                                 "2, 3; 60 on rank 1. Every rank must pass the same dataset_size (the whole "
                                 "dataset's size"), m["shard"]
    assert "different seed: 0 on rank 0; 1 on rank 1; 2 on rank 2; 3 on rank 3" in m["seed"], m["seed"]
    assert m["model_group"].startswith("LoadBalancer: the DDP model reduces its gradients over ranks [0, 1, 2, 3] "
                                       "but process_group balances over ranks [0, 1]"), m["model_group"]
    assert "balances over ranks [2, 3]" in got[2]["model_group"]
    assert "different model: None on rank 0; 'DistributedDataParallel' on ranks 1, 2, 3" in m["model_on_some"], \
        m["model_on_some"]


def test_needs_init_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        LoadBalancer(None, dataset_size=100, global_batch=10)


# ---- a hung rank: the others stop with an error naming it ----


def _hang_worker(rank, world, store, out):
    init(rank, world, store)
    lb = LoadBalancer(None, dataset_size=1000, global_batch=30, balancer="bsp", timeout_s=4, monitor=fixed_metrics)
    t0 = time.time()
    try:
        for g in range(10):
            if rank == 2 and g == 3:
                time.sleep(60)  # hangs past every timeout; the test ends it
            lb.record_compute(1e-3)
            lb.step()
        result = "finished"
    except RuntimeError as e:
        result = str(e)
    write_pickle(os.path.join(out, f"hang-{rank}.pkl"), (result, time.time() - t0))
    os._exit(0)  # no destroy_process_group: the hung rank never joins


def test_hung_rank_is_named_and_others_stop(tmp_path):
    ctx = mp.get_context(resolved_start_method())  # as spawn() does
    store = tmp_path / "store-hang"
    procs = [ctx.Process(target=_hang_worker, args=(r, 3, str(store), str(tmp_path))) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs[:2]:
        p.join(timeout=90)
    procs[2].kill()
    procs[2].join()
    for r in range(2):
        assert (tmp_path / f"hang-{r}.pkl").exists(), f"rank {r} did not stop"
        msg, took = read_pickle(tmp_path / f"hang-{r}.pkl")
        assert msg.startswith("LoadBalancer: step 3"), msg
        assert took < 60, f"rank {r} took {took:.0f} s"
    for r in range(2):  # every rank that answers hears the same verdict
        msg = read_pickle(tmp_path / f"hang-{r}.pkl")[0]
        assert "not answering: rank 2 (" in msg, msg


# ---- BatchNorm: a warning once when plain BatchNorm meets uneven sizes ----


def _batchnorm_worker(rank, world, store, out):
    init(rank, world, store)
    x, y = data()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(DIM, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, CLASSES)).double()
    counts = {}
    # SyncBatchNorm needs a GPU in DDP: the silent case here is plain BatchNorm with equal sizes (bsp).
    for name, balancer in (("uneven", "random:3"), ("equal", "bsp")):
        lb = LoadBalancer(DDP(net), dataset_size=N, global_batch=24, balancer=balancer, seed=1, min_batch=2,
                          monitor=fixed_metrics)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for g in range(4):
                lb.indices(0, g)
                lb.record_compute(1e-3)
                lb.step()
        counts[name] = [str(w.message) for w in caught if "BatchNorm" in str(w.message)]
    write_pickle(os.path.join(out, f"bn-{rank}.pkl"), counts)
    finish()


def test_plain_batchnorm_warns_once(tmp_path):
    spawn(_batchnorm_worker, 2, tmp_path)
    for r in range(2):
        counts = read_pickle(tmp_path / f"bn-{r}.pkl")
        assert len(counts["uneven"]) == 1 and "SyncBatchNorm" in counts["uneven"][0], counts
        assert counts["equal"] == [], counts


# ---- measurement: the whole step counts, wherever the rank's per-sample cost lands ----


class _SlowDataset(torch.utils.data.Dataset):
    """(x[i], y[i]), sleeping `cost` seconds per sample read (emulated decoding in the main process)."""

    def __init__(self, x, y, cost):
        self.x, self.y, self.cost = x, y, cost

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.cost)
        return self.x[i], self.y[i]


class _SlowForward(torch.nn.Module):
    """The model, sleeping `cost` seconds per sample of its input in forward."""

    def __init__(self, net, cost):
        super().__init__()
        self.net, self.cost = net, cost

    def forward(self, x):
        time.sleep(len(x) * self.cost)
        return self.net(x)


def _where_worker(rank, world, store, out, where):
    init(rank, world, store)
    cost = 1.5e-3 if rank == world - 1 else 3e-4  # per sample; the last rank is 5x slower, in `where`
    g = np.random.default_rng(1)
    x, y = torch.from_numpy(g.normal(size=(64 * 25, DIM))), torch.from_numpy(g.integers(0, CLASSES, 64 * 25))
    net = make_model()
    model = DDP(_SlowForward(net, cost if where == "forward" else 0.0))
    lb = LoadBalancer(model, dataset_size=len(x), global_batch=64, balancer="lbbsp-cpu", predictor="ema", seed=1,
                      monitor=fixed_metrics)
    loader = lb.data_loader(_SlowDataset(x, y, cost if where == "load" else 0.0))  # no workers: the main process
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for xb, yb in loader:
        loss = lb.scale(F.cross_entropy(model(xb), yb))
        loss.backward()
        if where.startswith("after_backward"):
            time.sleep(len(xb) * cost)
        if where == "after_backward_logged":  # the fast ranks wait here for the slow one: not their work
            with lb.untimed():
                dist.all_reduce(loss.detach().clone())
        opt.step()
        opt.zero_grad()
        lb.step()
    if rank == 0:
        np.save(os.path.join(out, f"where-{where}.npy"), lb.batch_sizes)
    finish()


@pytest.mark.parametrize("where", ["load", "forward", "after_backward", "after_backward_logged"])
def test_rank_slowed_anywhere_in_the_step_gets_fewer_samples(tmp_path, where):
    """after_backward_logged: a logging all_reduce of the user's own after the slow part, in lb.untimed() as
    docs/torch.md says (without it the fast ranks' wait there counts as their work and they look as slow)."""
    spawn(_where_worker, 3, tmp_path, where)
    sizes = np.load(tmp_path / f"where-{where}.npy")
    assert sizes.sum() == 64
    assert sizes[2] < 0.5 * min(sizes[0], sizes[1]), (where, sizes)


def _change_worker(rank, world, store, out):
    init(rank, world, store)
    cost = 4e-3  # seconds per sample, after backward, on every rank
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=48, balancer="random:5", seed=1, monitor=fixed_metrics)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = []
    for g in range(16):
        n = int(lb.batch_sizes[rank])
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        lb.scale(F.cross_entropy(model(x[idx]), y[idx])).backward()
        time.sleep(n * cost)
        opt.step()
        opt.zero_grad()
        lb.step()
        rows.append((n, lb.figures()["lbbsp/measured_s"]))
    np.save(os.path.join(out, f"change-{rank}.npy"), np.array(rows))
    finish()


def test_a_changed_size_is_measured_on_the_new_size(tmp_path):
    """With a DDP model on the CPU a step's window opens as the previous step's allreduce completes, so it starts
    with the previous step's work after backward. Where the size changed, that part counts as the new size
    costs: the time reported is nearer the new size's cost than the old one's (before, it was the old one's)."""
    spawn(_change_worker, 3, tmp_path)
    cost, checked = 4e-3, 0
    for r in range(3):
        rows = np.load(tmp_path / f"change-{r}.npy")
        for (before, _), (n, measured) in zip(rows[:-1], rows[1:]):
            if before >= 4 and 0.5 <= n / before <= 2 and abs(n - before) >= 6:
                checked += 1
                assert abs(measured - cost * n) < abs(measured - cost * before), (r, before, n, measured)
    assert checked >= 3, "random:5 changed the sizes too little: the test lost its point"


# ---- a mean-reduced loss through lb.scale (with an L2 term inside) equals one process ----

L2 = 1e-2


def _l2(model):
    return sum((p * p).sum() for p in model.parameters())


def _mean_worker(rank, world, store, out, steps, global_batch):
    init(rank, world, store)
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=global_batch, balancer="random:5", seed=3,
                      monitor=fixed_metrics)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sizes = []
    for g in range(steps):
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        sizes.append(lb.batch_sizes.tolist())
        loss = lb.scale(F.cross_entropy(model(x[idx]), y[idx]) + L2 * _l2(model.module))
        loss.backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    params = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy()
    np.save(os.path.join(out, f"mean-{rank}.npy"), params)
    write_pickle(os.path.join(out, f"mean-sizes-{rank}.pkl"), sizes)
    finish()


def test_scaled_mean_loss_with_l2_equals_one_process(tmp_path):
    world, steps, X = 3, 20, 24
    spawn(_mean_worker, world, tmp_path, steps, X)
    sizes = np.array(read_pickle(tmp_path / "mean-sizes-0.pkl"))
    assert (sizes == 0).any(), "random:5 gave no 0-sample rank: the test lost its point"
    ref = one_process(steps, X, l2=L2, mean=True)
    assert_equal_to_one_process(ref, [tmp_path / f"mean-{r}.npy" for r in range(world)])


# ---- the common mistake, an unscaled mean loss, warns; timed() is deprecated ----


def _loss_check_worker(rank, world, store, out):
    import warnings
    init(rank, world, store)
    x, y = data()
    result = {}
    for name in ("unscaled", "scaled", "sum", "opted_out"):
        model = lb = None
        gc.collect()  # the previous pair and its process groups go here, in this thread, not in a gloo callback's
        model = DDP(make_model())
        lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:2", seed=1,
                          monitor=fixed_metrics, check_loss=name != "opted_out")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for g in range(3):
                idx = torch.from_numpy(lb.indices(0, g))
                if name == "scaled":
                    loss = lb.scale(F.cross_entropy(model(x[idx]), y[idx]))
                elif name == "sum":
                    loss = lb.scale(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"), reduction="sum")
                elif name == "opted_out":
                    loss = F.cross_entropy(model(x[idx]), y[idx], reduction="sum") / lb.global_batch
                else:
                    loss = F.cross_entropy(model(x[idx]), y[idx])  # the mistake
                loss.backward()
                lb.step()
            with lb.timed():
                pass
        result[name] = [str(w.message) for w in caught if "lb.scale" in str(w.message)]
        result[name + "-timed"] = [w.category.__name__ for w in caught if "timed()" in str(w.message)]
    try:
        lb.scale(torch.zeros(3))
        result["vector"] = "no error"
    except ValueError as e:
        result["vector"] = str(e)
    lb = None  # dropped while its model trains on: the hook stays and still sums
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            F.cross_entropy(model(x[:8]), y[:8]).backward()
    result["dropped"] = [str(w.message) for w in caught if "LoadBalancer" in str(w.message)]
    write_pickle(os.path.join(out, f"loss-{rank}.pkl"), result)
    finish()


def test_unscaled_mean_loss_warns_once(tmp_path):
    spawn(_loss_check_worker, 2, tmp_path)
    for r in range(2):
        got = read_pickle(tmp_path / f"loss-{r}.pkl")
        assert len(got["unscaled"]) == 1 and "reduction='mean'" in got["unscaled"][0], got
        assert got["scaled"] == got["sum"] == got["opted_out"] == [], got
        assert got["scaled-timed"] == ["DeprecationWarning"], got
        assert "must be a scalar tensor" in got["vector"], got
        assert len(got["dropped"]) == 1 and "LoadBalancer is gone" in got["dropped"][0], got["dropped"]


# ---- a DataLoader over an HDF5 file, 2 workers, reused over epochs, resumed mid-epoch: equals one process ----


class _H5Dataset(torch.utils.data.Dataset):
    """Map-style: sample i of an HDF5 file read through h5py, the file opened in each worker process."""

    def __init__(self, path):
        import h5py
        self.path, self.file = path, None
        with h5py.File(path, "r") as f:
            self.n = len(f["y"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import h5py
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return torch.from_numpy(self.file["x"][i]), int(self.file["y"][i])


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(N))


def _h5_worker(rank, world, store, out, phase, stop):
    from lbbsp.torch import required_lag
    init(rank, world, store)
    model_net = make_model()
    opt_state = None
    if phase == "resume":
        ckpt = torch.load(os.path.join(out, "ckpt.pt"))
        model_net.load_state_dict(ckpt["model"])
        opt_state = ckpt["opt"]
    model = DDP(model_net)
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:5", seed=4, min_batch=0,
                      monitor=fixed_metrics)  # lag left to data_loader(): 2 workers x prefetch 1
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if phase == "resume":
        lb.load_state_dict(ckpt["lb"])
        opt.load_state_dict(opt_state)
    ds = _H5Dataset(os.path.join(out, "data.h5"))
    loader = lb.data_loader(ds, num_workers=2, prefetch_factor=1, persistent_workers=True)
    assert lb.lag == required_lag(2, 1) == 2, lb.lag
    x, y = data()
    lengths, sizes = [], []
    for epoch in range(lb.epoch, 2):
        loader.batch_sampler.set_epoch(epoch)
        lengths.append(len(loader))
        for xb, yb in loader:
            g = lb.global_step
            want = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
            assert torch.equal(xb, x[want]) and torch.equal(yb, y[want]), f"step {g}: not this rank's samples"
            sizes.append(lb.batch_sizes.tolist())
            loss = lb.scale(F.cross_entropy(model(xb), yb))
            loss.backward()
            opt.step()
            opt.zero_grad()
            lb.step()
            if lb.global_step == stop:
                break
        if lb.global_step == stop:
            break
    result = {"lengths": lengths, "sizes": sizes}
    if phase == "first":
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "lb": lb.state_dict()},
                       os.path.join(out, "ckpt.pt"))
        errors = {}
        for name, call in (("past_epoch", lambda: (loader.batch_sampler.set_epoch(0), iter(loader.batch_sampler)
                                                   .__next__())),
                           ("past_step", lambda: lb.indices(0, 0)),
                           ("lag", lambda: lb.data_loader(ds, num_workers=2, prefetch_factor=2)),
                           ("iterable", lambda: lb.data_loader(_Stream())),
                           ("length", lambda: lb.data_loader(torch.utils.data.Subset(ds, range(len(ds) - 1))))):
            try:
                call()
                errors[name] = "no error"
            except (RuntimeError, ValueError, TypeError) as e:
                errors[name] = str(e)
        result["errors"] = errors
    else:
        result["params"] = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy()
    loader = None  # persistent workers end here
    write_pickle(os.path.join(out, f"h5-{phase}-{rank}.pkl"), result)
    finish()


def test_h5_dataloader_workers_resume_equals_one_process(tmp_path):
    import h5py
    x, y = data()
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["x"], f["y"] = x.numpy(), y.numpy()
    spawn(_h5_worker, 2, tmp_path, "first", 13)  # stops at step 3 of epoch 1 (10 steps per epoch)
    spawn(_h5_worker, 2, tmp_path, "resume", -1)
    first = [read_pickle(tmp_path / f"h5-first-{r}.pkl") for r in range(2)]
    resumed = [read_pickle(tmp_path / f"h5-resume-{r}.pkl") for r in range(2)]
    assert first[0]["lengths"] == [10, 10] and resumed[0]["lengths"] == [7], (first[0], resumed[0])
    sizes = np.array(first[0]["sizes"] + resumed[0]["sizes"])
    assert sizes.shape == (20, 2) and (sizes.sum(axis=1) == 24).all()
    assert (sizes == 0).any(), "random:5 gave no 0-sample rank: empty slices went untested"
    errors = first[0]["errors"]
    assert "epoch 0 is past: the run is at step 13 (epoch 1, step 3)" in errors["past_epoch"], errors
    assert "step 0 of epoch 0 is past: the run is at step 13" in errors["past_step"], errors
    assert "reads 4 batches ahead" in errors["lag"] and "lag=4" in errors["lag"], errors
    assert "an IterableDataset yields samples in its own order" in errors["iterable"], errors
    assert f"the dataset has {N - 1} samples but this LoadBalancer was built with dataset_size={N}" in \
        errors["length"], errors
    ref = one_process(20, 24, seed=4, mean=True)
    for r in range(2):
        rel = np.linalg.norm(resumed[r]["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r}: relative difference {rel:.3g} from one process"


def _forgot_step_worker(rank, world, store, out):
    init(rank, world, store)
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, seed=1, monitor=fixed_metrics)
    error = None
    try:  # the loop without lb.step(): the sampler cannot hand out step 1
        for xb, yb in lb.data_loader(torch.utils.data.TensorDataset(x, y)):
            lb.scale(F.cross_entropy(model(xb), yb)).backward()
    except RuntimeError as e:
        error = str(e)
    dump_rank(out, "forgot", rank, error)
    finish()


def test_a_loop_without_step_says_so(tmp_path):
    spawn(_forgot_step_worker, 2, tmp_path)
    for error in load_ranks(tmp_path, "forgot", 2):
        assert error is not None and "step 0's backward has run but lb.step() has not" in error, error


def _own_loader_worker(rank, world, store, out):
    init(rank, world, store)
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:5", seed=1, monitor=fixed_metrics)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = torch.utils.data.TensorDataset(x, y)
    own = torch.utils.data.DataLoader(ds, batch_size=12, sampler=torch.utils.data.DistributedSampler(ds))
    seen = {}
    for name, loader in (("balanced", lb.data_loader(ds)), ("own", own)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _, (xb, yb) in zip(range(4), loader):
                lb.scale(F.cross_entropy(model(xb), yb)).backward()
                opt.step()
                opt.zero_grad()
                lb.step()
        seen[name] = [str(w.message) for w in caught if "rows in its first input" in str(w.message)]
    dump_rank(out, "own", rank, seen)
    finish()


def test_batches_not_from_the_balancer_are_warned_about(tmp_path):
    spawn(_own_loader_worker, 2, tmp_path)
    for seen in load_ranks(tmp_path, "own", 2):
        assert seen["balanced"] == [], seen
        assert len(seen["own"]) == 1 and "had 12 rows in its first input" in seen["own"][0], seen


# ---- an exception on a non-zero rank in step() ends every rank, naming it ----


def _failing_worker(rank, world, store, out, lag):
    init(rank, world, store)
    calls = [0]

    def monitor():
        calls[0] += 1
        if rank == 2 and calls[0] == 4:
            raise OSError("sensor exploded")
        return [1.0, 0.5, 0.0]

    lb = LoadBalancer(None, dataset_size=1000, global_batch=30, balancer="lbbsp-cpu", timeout_s=20,
                      monitor=monitor, lag=lag)
    t0 = time.time()
    result = "finished"
    try:
        for _g in range(10):
            lb.record_compute(1e-3)
            lb.step()
    except RuntimeError as e:
        result = str(e)
    took = time.time() - t0
    dist.barrier()  # every process stays alive until all have their answer: no rank ends by another's death
    write_pickle(os.path.join(out, f"fail-{lag}-{rank}.pkl"), (result, took))
    finish()


@pytest.mark.parametrize("lag", [0, 2])  # with lag >= 1 step 3 is decided after later steps' reports were built
def test_error_on_nonzero_rank_ends_every_rank_naming_it(tmp_path, lag):
    spawn(_failing_worker, 3, tmp_path, lag)
    for r in range(3):
        msg, took = read_pickle(tmp_path / f"fail-{lag}-{r}.pkl")
        expected = "LoadBalancer: step 3: rank 2 failed in its report: rank 2: OSError: sensor exploded"
        assert msg.startswith(expected), msg
        assert took < 20, f"rank {r} took {took:.1f} s, more than timeout_s"


# ---- init_from_env keeps PyTorch's default timeout unless asked ----


def test_init_from_env_keeps_default_timeout(monkeypatch):
    import lbbsp.torch as lt
    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: calls.append(kw))
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29999")):
        monkeypatch.setenv(k, v)
    assert lt.init_from_env(backend="gloo") == 0
    assert "timeout" not in calls[-1], calls
    lt.init_from_env(backend="gloo", timeout_s=42)
    assert calls[-1]["timeout"] == datetime.timedelta(seconds=42)
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        lt.init_from_env(backend="gloo", timeout_s=0)


# ---- the extension is built for one x86-64 baseline, not for the node that built it ----


def test_extension_is_portable():
    """pyproject.toml sets LBBSP_PORTABLE (no -march=native) and python/CMakeLists.txt one baseline, x86-64-v3: the
    compile flags recorded in the extension (-frecord-gcc-switches) name that -march and no other (a -march=native
    build records the node's own, e.g. -march=znver3), and its code has no AVX-512 (zmm or mask register)."""
    import platform
    import re
    import shutil
    import subprocess
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    if shutil.which("objdump") is None or shutil.which("readelf") is None:
        pytest.skip("no objdump/readelf (binutils)")
    src = os.environ.get("LBBSP_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
    assert re.search(r'^LBBSP_PORTABLE\s*=\s*"ON"', open(os.path.join(src, "pyproject.toml")).read(), re.M)
    so = lbbsp._lbbsp.__file__
    switches = subprocess.run(["readelf", "-p", ".GCC.command.line", so], capture_output=True, text=True).stdout
    assert "-O" in switches, f"no compile flags recorded in {so}: {switches[:300]}"
    assert set(re.findall(r"-march=(\S+)", switches)) == {"x86-64-v3"}, switches
    assert "native" not in switches, switches
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", so], capture_output=True, text=True,
                          check=True).stdout
    assert len(text) > 10000, "objdump printed almost nothing"
    avx512 = [line for line in text.splitlines() if re.search(r"%zmm\d|%k[1-7]\b", line)]
    assert avx512 == [], f"{len(avx512)} AVX-512 instructions in {so}, e.g. {avx512[:3]}"


# ---- the same state on every rank; a state saved at 4 ranks mid-epoch continues at 3, equal to one process ----


def _world_change_worker(rank, world, store, out, phase, stop):
    import warnings
    init(rank, world, store)
    x, y = data()
    net = make_model()
    opt_state = None
    if phase == "resume":
        ckpt = torch.load(os.path.join(out, "wc.pt"))
        net.load_state_dict(ckpt["model"])
        opt_state = ckpt["opt"]
    model = DDP(net)
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="lbbsp-cpu", predictor="ema", seed=3,
                      monitor=fixed_metrics)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    caught = []
    if phase == "resume":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lb.load_state_dict(ckpt["lb"])
        opt.load_state_dict(opt_state)
    sizes = []
    while lb.global_step < stop:
        idx = torch.from_numpy(lb.indices(*divmod(lb.global_step, lb.steps_per_epoch)))
        sizes.append(lb.batch_sizes.tolist())
        loss = lb.scale(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"), reduction="sum")
        loss.backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    state = lb.state_dict()
    if phase == "first" and rank == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "lb": state},
                   os.path.join(out, "wc.pt"))
    params = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy()
    np.save(os.path.join(out, f"wc-{phase}-{rank}.npy"), params)
    write_pickle(os.path.join(out, f"wc-{phase}-{rank}.pkl"),
                 {"state": pickle.dumps(state), "sizes": sizes, "warnings": [str(w.message) for w in caught]})
    finish()


def test_state_is_identical_everywhere_and_loads_at_another_world_size(tmp_path):
    spawn(_world_change_worker, 4, tmp_path, "first", 7)  # 10 steps per epoch: stops mid-epoch
    spawn(_world_change_worker, 3, tmp_path, "resume", 20)
    first = [read_pickle(tmp_path / f"wc-first-{r}.pkl") for r in range(4)]
    assert all(f["state"] == first[0]["state"] for f in first), "state_dict() differs between ranks"
    assert pickle.loads(first[0]["state"])["step"] == 7
    resumed = [read_pickle(tmp_path / f"wc-resume-{r}.pkl") for r in range(3)]
    assert all(r["state"] == resumed[0]["state"] for r in resumed), "state_dict() differs between ranks"
    assert "saved at 4 ranks and this run has 3" in " ".join(resumed[0]["warnings"]), resumed[0]["warnings"]
    sizes = np.array(resumed[0]["sizes"])
    assert sizes.shape == (13, 3) and (sizes.sum(axis=1) == 24).all(), sizes
    assert all(r["sizes"] == resumed[0]["sizes"] for r in resumed)
    assert_equal_to_one_process(one_process(20, 24), [tmp_path / f"wc-resume-{r}.npy" for r in range(3)])


# ---- torch.distributed.checkpoint: every rank saves, a LoadBalancer of another lag or world size loads ----


def _dcp_worker(rank, world, store, out, phase):
    import warnings

    import torch.distributed.checkpoint as dcp
    init(rank, world, store)
    x, y = data()
    ckpt = os.path.join(out, "dcp")

    def build(lag):  # a fresh model and LoadBalancer; a rank's time is its batch x its slowness (deterministic)
        model = DDP(make_model())
        return model, LoadBalancer(model, dataset_size=N, global_batch=24, balancer="lbbsp-cpu", predictor="ema",
                                   seed=3, lag=lag, monitor=fixed_metrics)

    def train(model, lb, stop):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: the model's state is all there is
        sizes = []
        while lb.global_step < stop:
            idx = torch.from_numpy(lb.indices(*divmod(lb.global_step, lb.steps_per_epoch)))
            sizes.append(lb.batch_sizes.tolist())
            lb.record_compute(1e-3 * len(idx) * (3 if rank == world - 1 else 1))
            lb.scale(F.cross_entropy(model(x[idx]), y[idx])).backward()
            opt.step()
            opt.zero_grad()
            lb.step()
        return sizes

    result = {}
    if phase == "save":
        model, lb = build(lag=1)
        train(model, lb, 7)  # 10 steps per epoch: mid-epoch
        dcp.save({"model": model.module.state_dict(), "lb": lb.state_dict()}, checkpoint_id=ckpt)
        result["through"] = train(model, lb, 14)
        result["params"] = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy()
    model, lb = build(lag=0)  # a template of another lag (and, at the resume, another world size)
    state = {"model": model.module.state_dict(), "lb": lb.state_dict()}
    dcp.load(state, checkpoint_id=ckpt)
    model.module.load_state_dict(state["model"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lb.load_state_dict(state["lb"])
    result["resumed_at"] = lb.global_step
    result["resumed"] = train(model, lb, 14)
    result["resumed_params"] = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy()
    result["warnings"] = [str(w.message) for w in caught]
    np.save(os.path.join(out, f"dcp-{phase}-{rank}.npy"), result["resumed_params"])
    dump_rank(out, f"dcp-{phase}", rank, result)
    finish()


@pytest.mark.skipif(not TORCH2, reason="torch.distributed.checkpoint's save/load are PyTorch 2.x (python.torch2)")
def test_distributed_checkpoint_saves_and_loads_the_state(tmp_path):
    spawn(_dcp_worker, 3, tmp_path, "save")
    got = load_ranks(tmp_path, "dcp-save", 3)
    for g in got:
        assert g["resumed_at"] == 7 and g["warnings"] == [], (g["resumed_at"], g["warnings"])
        assert g["resumed"] == g["through"] == got[0]["through"], "the resumed run decided other sizes"
        assert np.linalg.norm(g["resumed_params"] - g["params"]) < 1e-12 * np.linalg.norm(g["params"])
    assert got[0]["through"][0] != [8, 8, 8], "still the equal split at step 7: a fresh balancer would match it"
    spawn(_dcp_worker, 2, tmp_path, "resume")  # the same checkpoint at 2 ranks
    for r in range(2):
        g = read_pickle(tmp_path / f"dcp-resume-{r}.pkl")
        assert g["resumed_at"] == 7 and "saved at 3 ranks and this run has 2" in " ".join(g["warnings"])
        assert len(g["resumed"]) == 7 and all(sum(s) == 24 for s in g["resumed"]), g["resumed"]
    ref = one_process(14, 24, mean=True, momentum=0.0)
    assert_equal_to_one_process(ref, [tmp_path / f"dcp-{phase}-{r}.npy" for phase, world in (("save", 3), ("resume", 2))
                                      for r in range(world)])


# ---- step() does not wait for another rank's work after its backward (the reports left with the gradients) ----


def _no_wait_worker(rank, world, store, out, lag):
    init(rank, world, store)
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="lbbsp-cpu", predictor="ema", lag=lag,
                      monitor=fixed_metrics, timeout_s=30)
    stepped = os.path.join(out, f"stepped-{lag}")
    result = "finished"
    try:
        for g in range(6):
            idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
            lb.scale(F.cross_entropy(model(x[idx]), y[idx])).backward()
            if rank == 1 and g == 3:  # rank 1 holds on after backward until rank 0 is through step()
                for _ in range(600):
                    if os.path.exists(stepped):
                        break
                    time.sleep(0.1)
                else:
                    result = "rank 0 did not get through step() while rank 1 held on"
            lb.step()
            if rank == 0 and g == 3:
                open(stepped, "w").close()
    except RuntimeError as e:
        result = str(e)
    write_pickle(os.path.join(out, f"nowait-{lag}-{rank}.pkl"), result)
    finish()


@pytest.mark.parametrize("lag", [0, 1])
def test_step_does_not_wait_for_work_after_backward(tmp_path, lag):
    spawn(_no_wait_worker, 2, tmp_path, lag)
    for r in range(2):
        assert read_pickle(tmp_path / f"nowait-{lag}-{r}.pkl") == "finished"


# ---- a rank that uses another batch vector is named on every rank ----


def _diverged_worker(rank, world, store, out, odd=1):
    init(rank, world, store)
    group = None
    if world == 4:  # data-parallel pairs [0, 1] and [2, 3]: messages name global ranks
        group = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    lb = LoadBalancer(None, dataset_size=1000, global_batch=30, balancer="bsp", monitor=fixed_metrics,
                      process_group=group)
    result = "finished"
    try:
        for g in range(8):
            if rank == odd and g == 4:  # this rank's sizes drift from the others'
                lb._sizes[g] = lb._sizes[g] + np.eye(lb.world_size, dtype=np.int64)[0] - np.eye(
                    lb.world_size, dtype=np.int64)[-1]
            lb.indices(0, g)
            lb.record_compute(1e-3)
            lb.step()
    except RuntimeError as e:
        result = str(e)
    write_pickle(os.path.join(out, f"diverged-{rank}.pkl"), result)
    finish()


def test_ranks_using_another_batch_vector_are_named(tmp_path):
    spawn(_diverged_worker, 3, tmp_path)
    for r in range(3):
        msg = read_pickle(tmp_path / f"diverged-{r}.pkl")
        assert msg.startswith("LoadBalancer: step 4: the ranks used different batch vectors: ranks 0, 2 "), msg
        assert "; rank 1 (checksum" in msg, msg


def test_ranks_are_named_by_their_global_rank_in_a_subgroup(tmp_path):
    spawn(_diverged_worker, 4, tmp_path, 3)
    msgs = load_ranks(tmp_path, "diverged", 4)
    assert msgs[:2] == ["finished", "finished"], msgs
    for msg in msgs[2:]:
        assert msg.startswith("LoadBalancer: step 4: the ranks used different batch vectors: rank 2 (checksum "), msg
        assert "; rank 3 (checksum" in msg, msg


# ---- data-parallel subgroups: 4 processes as 2 groups of 2, each balanced on its own ----


def _subgroup_worker(rank, world, store, out, steps):
    init(rank, world, store)
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every process enters every new_group
    mine = groups[rank // 2]
    x, y = data()
    model = DDP(make_model(), process_group=mine)
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer=f"random:{5 + rank // 2}", seed=3,
                      process_group=mine, monitor=fixed_metrics)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sizes = []
    for g in range(steps):
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        sizes.append(lb.batch_sizes.tolist())
        lb.scale(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"), reduction="sum").backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    np.save(os.path.join(out, f"sub-{rank}.npy"), flat_params(model.module))
    write_pickle(os.path.join(out, f"sub-{rank}.pkl"), (lb.rank, lb.world_size, sizes))
    finish()


def test_data_parallel_subgroups_balance_on_their_own(tmp_path):
    spawn(_subgroup_worker, 4, tmp_path, 12)
    got = [read_pickle(tmp_path / f"sub-{r}.pkl") for r in range(4)]
    assert [(g[0], g[1]) for g in got] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert got[0][2] == got[1][2] and got[2][2] == got[3][2], "ranks of one group disagree on the sizes"
    assert got[0][2] != got[2][2], "the two groups were not balanced apart (random:5 and random:6)"
    assert all(sum(s) == 24 for g in got for s in g[2])
    assert_equal_to_one_process(one_process(12, 24), [tmp_path / f"sub-{r}.npy" for r in range(4)])


def test_cuda_cap_counts_the_allocators_cache():
    from lbbsp.torch.controller import cuda_cap
    assert cuda_cap(free=1000, cached=200, bytes_per_sample=10.0) == 120
    assert cuda_cap(free=1000, cached=-5, bytes_per_sample=10.0) == 100
    assert cuda_cap(free=0, cached=0, bytes_per_sample=10.0) == 1


# ---- gradient accumulation: micro-batches of the rank's slice under no_sync equal one process ----


def _accumulate_worker(rank, world, store, out, steps):
    init(rank, world, store)
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:5", seed=3, monitor=fixed_metrics)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for g in range(steps):
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        chunks = [idx[:len(idx) // 2], idx[len(idx) // 2:]]  # two micro-batches, either possibly empty
        with model.no_sync():
            lb.scale(F.cross_entropy(model(x[chunks[0]]), y[chunks[0]]), count=len(chunks[0])).backward()
        lb.scale(F.cross_entropy(model(x[chunks[1]]), y[chunks[1]]), count=len(chunks[1])).backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    try:  # the same without count: each micro-batch's mean weighted by the whole slice, refused
        with model.no_sync():
            lb.scale(F.cross_entropy(model(x[:2]), y[:2]))
        wrong = None
    except ValueError as e:
        wrong = str(e)
    assert wrong is not None and "no_sync()" in wrong and "count=len(y)" in wrong, wrong
    np.save(os.path.join(out, f"acc-{rank}.npy"), flat_params(model.module))
    finish()


def test_gradient_accumulation_with_no_sync_equals_one_process(tmp_path):
    spawn(_accumulate_worker, 3, tmp_path, 20)
    assert_equal_to_one_process(one_process(20, 24, mean=True), [tmp_path / f"acc-{r}.npy" for r in range(3)])


def _micro_worker(rank, world, store, out, steps):
    init(rank, world, store)
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:5", seed=3, monitor=fixed_metrics,
                      micro_batches=3)
    loader = lb.data_loader(torch.utils.data.TensorDataset(x, y))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []
    for _epoch in range(2):
        for i, (xb, yb) in enumerate(loader):
            seen.append(len(yb))
            last = i % lb.micro_batches == lb.micro_batches - 1
            with contextlib.nullcontext() if last else model.no_sync():
                lb.scale(F.cross_entropy(model(xb), yb)).backward()  # the micro-batch's mean, weighted by its size
            if last:
                opt.step()
                opt.zero_grad()
                lb.step()
    wrong = None
    try:  # a step whose scale() calls do not match micro_batches ends with an error on every rank
        xb, yb = x[:2], y[:2]
        with model.no_sync():
            lb.scale(F.cross_entropy(model(xb), yb)).backward()
        lb.step()
    except RuntimeError as e:
        wrong = str(e)
    np.save(os.path.join(out, f"micro-{rank}.npy"), flat_params(model.module))
    write_pickle(os.path.join(out, f"micro-{rank}.pkl"), (seen, wrong))
    finish()


def test_micro_batches_from_the_sampler_equal_one_process(tmp_path):
    spawn(_micro_worker, 3, tmp_path, 20)
    assert_equal_to_one_process(one_process(20, 24, mean=True), [tmp_path / f"micro-{r}.npy" for r in range(3)])
    got = [read_pickle(tmp_path / f"micro-{r}.pkl") for r in range(3)]
    assert all(len(seen) == 60 for seen, _ in got), [len(seen) for seen, _ in got]  # 20 steps x 3 micro-batches
    totals = np.add.reduceat(np.array([seen for seen, _ in got]), np.arange(0, 60, 3), axis=1).sum(axis=0)
    assert (totals == 24).all(), totals
    for r, (_, wrong) in enumerate(got):
        assert wrong is not None and "called 1 times for micro_batches=3" in wrong, (r, wrong)
        assert "rank 0" in wrong or "ranks 0" in wrong, (r, wrong)


def test_only_collective_errors_are_taken_for_a_hung_peer():
    from lbbsp.torch.exchange import is_collective_error
    gloo = RuntimeError("Got the following error when running the callback: RuntimeError: [../third_party/gloo/gloo/"
                        "transport/tcp/unbound_buffer.cc:78] Timed out waiting 8000ms for recv operation to complete")
    assert is_collective_error(gloo)
    assert is_collective_error(RuntimeError("[pair.cc:561] Connection closed by peer [127.0.0.1]:54164"))
    # the user's own mistakes in backward are re-raised as they are, not blamed on other ranks
    assert not is_collective_error(RuntimeError("element 0 of tensors does not require grad and does not have a "
                                                "grad_fn"))
    assert not is_collective_error(ValueError("timed out"))


def test_micro_sizes_and_the_lag_a_loader_needs():
    from lbbsp.torch import required_lag
    assert required_lag(2, 2, micro_batches=1) == 4
    assert required_lag(2, 2, micro_batches=3) == 2  # 4 micro-batches ahead are 2 steps at most
    assert required_lag(0, micro_batches=3) == 0
    with pytest.raises(ValueError, match="micro_batches"):
        required_lag(2, micro_batches=0)


# ---- bf16 autocast with GradScaler-style skipping of non-finite steps: the same on every rank ----


def _autocast_worker(rank, world, store, out, steps):
    init(rank, world, store)
    g = np.random.default_rng(2)
    x = torch.from_numpy(g.normal(size=(N, DIM))).float()
    y = x[:, :CLASSES].argmax(1)  # learnable: the loss must fall
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))
    model = DDP(net)
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:5", seed=3, monitor=fixed_metrics)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses, skipped, sizes = [], [], []
    for step in range(steps):
        idx = torch.from_numpy(lb.indices(*divmod(step, lb.steps_per_epoch)))
        sizes.append(lb.batch_sizes.tolist())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x[idx]), y[idx])
        if step == 5 and rank == int(np.argmax(lb.batch_sizes)):
            loss = loss * float("inf")  # an overflow on one rank (one with samples): after the SUM all see it
        lb.scale(loss.float()).backward()
        finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
        if finite:
            opt.step()
        else:
            skipped.append(step)
        opt.zero_grad()
        lb.step()
        with torch.no_grad():
            losses.append(float(F.cross_entropy(model(x), y)))
    write_pickle(os.path.join(out, f"amp-{rank}.pkl"), (losses, skipped, sizes))
    finish()


def test_bf16_autocast_and_skipped_steps_agree_on_every_rank(tmp_path):
    spawn(_autocast_worker, 3, tmp_path, 30)
    got = [read_pickle(tmp_path / f"amp-{r}.pkl") for r in range(3)]
    assert all(s[1] == [5] for s in got), [s[1] for s in got]
    assert all(s[2] == got[0][2] for s in got), "the ranks' batch sizes differ"
    losses = got[0][0]
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3]), losses


# ---- examples/torch_fmnist.py: HDF5 through DataLoader workers, validation, a checkpoint resumed at another size ----


def synth_images(path):
    """A small dataset in the Fashion-MNIST HDF5 layout (600 train images of 28 x 28, 10 classes)."""
    import subprocess
    subprocess.run([os.environ.get("LBBSP_BIN", "lbbsp"), "data", "synth", "--samples", "600", "--features", "784",
                    "--classes", "10", "--seed", "1", "--out", str(path)], check=True, capture_output=True)


def test_example_trainer_resumes_at_another_world_size(tmp_path):
    import subprocess
    import sys as _sys
    src = os.environ.get("LBBSP_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
    data_file, ckpt = tmp_path / "synth.h5", tmp_path / "ck.pt"
    synth_images(data_file)
    example = [_sys.executable, os.path.join(src, "examples", "torch_fmnist.py"), "--data", str(data_file),
               "--global-batch", "60", "--checkpoint", str(ckpt)]
    first = subprocess.run(example + ["--spawn", "3", "--stop-after", "13"], capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "epoch 0: test accuracy" in first.stdout and "checkpoint at step 13" in first.stdout, first.stdout
    second = subprocess.run(example + ["--spawn", "2"], capture_output=True, text=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed at step 13 (epoch 1), saved by 3 ranks, now 2" in second.stdout, second.stdout
    assert "epoch 1: test accuracy" in second.stdout and "checkpoint at step 20" in second.stdout, second.stdout
    assert "saved at 3 ranks and this run has 2" in second.stderr, second.stderr
    # The same run without the stop: the resumed one trained on the same global batches (float32: other splits sum
    # in another order, so equal to rounding; a resume that repeated or skipped a step would be ~1e-2 away).
    full = subprocess.run(example[:-1] + [str(tmp_path / "full.pt"), "--spawn", "3"], capture_output=True, text=True)
    assert full.returncode == 0, full.stdout + full.stderr
    resumed, straight = (torch.load(f)["model"] for f in (ckpt, tmp_path / "full.pt"))
    flat = [torch.cat([t.flatten() for t in m.values()]) for m in (resumed, straight)]
    rel = (torch.linalg.norm(flat[0] - flat[1]) / torch.linalg.norm(flat[1])).item()
    print(f"resumed at 2 ranks vs straight through at 3: relative difference {rel:.3g}")
    assert rel < 1e-4, f"the resumed run's parameters are {rel:.3g} away from the run that did not stop"
