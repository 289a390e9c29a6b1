"""lbbsp.torch is exact on real gloo process groups (torch.multiprocessing, one thread per rank): every rank's
parameters equal one process's on the same global batches, with the sizes agreed on by every rank and 0-sample
ranks among them: a summed loss through the comm hook (2 to 16 ranks, the reports riding in the last gradient
bucket or all-gathered, lag 2, DDP's options, one rank, torch.compile), data-parallel subgroups,
gradient accumulation under no_sync and the sampler's micro-batches; bf16 autocast with a skipped non-finite step
alike on every rank (a mean loss through lb.scale or loss_reduction: test_torch_loss.py). The shared harness is
harness.py."""

import contextlib
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import (
    CLASSES,
    DIM,
    N,
    assert_equal_to_one_process,
    data,
    finish,
    fixed_metrics,
    flat_params,
    init,
    make_model,
    native_expected,
    one_process,
    read_pickle,
    spawn,
    write_pickle,
)
from torch.nn.parallel import DistributedDataParallel as DDP

import lbbsp
from lbbsp.torch import LoadBalancer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reports_riding_in_a_gradient_bucket_are_exact(dtype):
    """The report block that rides with the last bucket: summed over 3 ranks it gives every report back exactly,
    the 32-bit checksum included (two 16-bit halves: float32 holds integers to 2^24)."""
    from lbbsp.torch.report import CHECKSUM, REPORT, read_rows, write_row
    reports = np.array([[r * 100 + k + 0.25 for k in range(REPORT)] for r in range(3)])
    reports[:, CHECKSUM] = [0xFFFFFFFF, 0x80000001, 12345]
    blocks = [torch.full((3, REPORT + 1), 7.0, dtype=dtype) for _ in range(3)]  # stale values: write_row zeros them
    for r, block in enumerate(blocks):
        write_row(block.numpy(), r, reports[r])
    summed = sum(blocks)
    assert summed.dtype == dtype
    np.testing.assert_array_equal(read_rows(summed.numpy()), reports)


def test_report_row_holds_its_fields_and_the_vectors_checksum():
    """A report encodes to its fields in the layout's order, the checksum of the batch vector last: the same
    vector the same checksum on every rank, another vector (the same sizes in another order too) another one."""
    from lbbsp.torch.report import Report, checksum
    sizes = np.array([5, 3], dtype=np.int64)
    row = Report(5, 0.5, [1.0, 0.25, 3.0], 7, 4, False, sizes).encode()
    assert row.dtype == np.float64 and row[:-1].tolist() == [5, 0.5, 1.0, 0.25, 3.0, 7, 4, 0], row
    assert row[-1] == checksum(sizes.copy()) and 0 <= row[-1] < 2 ** 32 and row[-1] == int(row[-1])
    others = [checksum(np.array(v, dtype=np.int64)) for v in ([3, 5], [5, 2], [5, 3, 0], [6, 2])]
    assert len({row[-1], *others}) == 5, (row[-1], others)
    assert Report.of_failure(5, sizes).encode()[-2:].tolist() == [1.0, row[-1]]


@pytest.mark.parametrize("name", ["lbbsp-cpu", "lbbsp-gpu"])
def test_decision_from_report_rows_equals_the_checked_one(name):
    """The per-step decision in one C++ call (Balancer.next_from_report_rows) decides as the checked Python path
    (next_unchecked on the rows' columns, caps of 0 meaning none) over 120 steps of noisy reports with memory
    caps now and then; a row that is not the usual gives None and leaves the balancer as it was."""
    from lbbsp.torch.report import CHECKSUM, MEASURED, REPORT, STATUS, Report, Reports
    world, g = 4, np.random.default_rng(5)
    fast, checked = (lbbsp.Balancer(name, world, 256, seed=1, num_exo=3, capacity_exo=lbbsp.RANK_CAPACITY_EXO)
                     for _ in range(2))
    sizes = fast.initial()
    for step in range(120):
        caps = g.integers(70, 200, world) * (g.random(world) < 0.2)
        rows = np.stack([Report(int(n), n / (1000 * (r + 1)) * g.lognormal(0, 0.2) + 1e-3, list(g.random(3)),
                                int(caps[r]), int(n), False, sizes).encode() for r, n in enumerate(sizes)])
        for column, bad in ((STATUS, 1.0), (CHECKSUM, 1.0), (0, sizes[0] + 1.0), (MEASURED, -1.0)):
            odd = rows.copy()
            odd[1 if column != 0 else 0, column] = bad
            assert fast.next_from_report_rows(odd, sizes) is None, (step, column)
        assert fast.iteration == checked.iteration == step
        reports = Reports(rows)
        mem_cap = np.full(world, np.iinfo(np.int64).max, dtype=np.int64)
        mem_cap[caps > 0] = caps[caps > 0]
        want = checked.next_unchecked(reports.measured_batches.astype(np.int64), reports.compute_s, reports.exo,
                                      reports.exo, mem_cap)
        got = fast.next_from_report_rows(rows[:, :REPORT], sizes)
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
        sizes = got
    assert fast.save_state() == checked.save_state()


# ---- exactness: DDP + SUM hook == one process on the same global batches ----


def _exact_worker(rank, world, store, out, steps, global_batch, piggyback=True, lag=0, compile_backend=None,
                  ddp_options=None, path="auto"):
    init(rank, world, store)
    os.environ["LBBSP_TORCH_NATIVE"] = path  # "0": the Python hook, the C++ path's reference
    if not piggyback:  # the reports in the control group's all-gather, as for a large or half-precision bucket
        lbbsp.torch.exchange.ReportExchange.PIGGYBACK_MAX_BYTES = 0
    if piggyback == "refused":  # a backend without a coalesced allreduce (PyTorch's error, raised at the call)
        def refuse(*args, **kwargs):
            raise RuntimeError("Backend fake does not support allreduce_coalesced")
        dist.ProcessGroup.allreduce_coalesced = refuse
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
    paths = {"rides": lb.exchange.rides, "gathers": lb.exchange.gathers, "buffers": lb.exchange.buffers_made,
             "native": lb.native is not None, "one_call": lb.native.one_call_steps if lb.native is not None else 0}
    if compile_backend is not None:  # frames dynamo compiled (else the model ran eagerly and proved nothing)
        paths["compiled"] = torch._dynamo.utils.counters["frames"]["ok"]
    write_pickle(os.path.join(out, f"sizes-{world}-{rank}.pkl"), (sizes, paths))
    finish()


@pytest.mark.parametrize("world, piggyback, lag, path", [
    (2, True, 0, "auto"), (3, True, 0, "auto"), (4, True, 0, "auto"), (16, True, 0, "auto"), (3, False, 0, "auto"),
    (3, True, 2, "auto"), (3, True, 0, "0"), (3, False, 0, "0"), (3, True, 2, "0"), (3, "refused", 0, "0")])
def test_exact_against_one_process(tmp_path, world, piggyback, lag, path):
    """Every rank's parameters equal one process's, the sizes agree; with lag 2 too (reports taken as they
    arrive, the decision two steps ahead), and where the backend refuses the coalesced allreduce that the reports
    ride in (they take the all-gather from the first step on); on the C++ step path and on the Python one."""
    steps, X = 20, 24  # 10 steps per epoch: two epochs
    spawn(_exact_worker, world, tmp_path, steps, X, piggyback, lag, None, None, path)
    ref = one_process(steps, X)
    got = [read_pickle(tmp_path / f"sizes-{world}-{r}.pkl") for r in range(world)]
    sizes, paths = [g[0] for g in got], [g[1] for g in got]
    assert all(p["native"] == native_expected(path) for p in paths), paths
    # On the C++ path every step() went its usual course in one call (native.decide_step), with lag 2 too.
    one_call = steps if native_expected(path) else 0
    assert all(p["one_call"] == one_call for p in paths), paths
    # Every step's reports went the way asked: a silent fall-back to the all-gather would cost a collective.
    rides = piggyback is True
    want = {"rides": steps, "gathers": 0} if rides else {"rides": 0, "gathers": steps}
    assert all({k: p[k] for k in want} == want for p in paths), paths
    # The report block is reused, not made each step (with DDP a ride has arrived when backward() returns, so
    # step() reads it and frees its block); refused, the one block made is not tried again.
    assert all(p["buffers"] <= 1 for p in paths), paths
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
    assert all(g[1]["rides"] == 20 and g[1]["gathers"] == 0 and g[1]["native"] == native_expected()
               for g in got), [g[1] for g in got]
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
