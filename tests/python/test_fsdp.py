"""lbbsp.torch over FSDP2 (fully_shard per block and at the root) and HSDP (a 2-D mesh, replicate x shard) on gloo
process groups: exact against one process with zero-size slices (3 and 4 ranks, float64), with gradient
accumulation, the report riding in the last reduce-scatter (HSDP: its all-gather), on lbbsp.torch's C++ step path
and its Python one, a frozen layer's steps sending the report without riding, with bf16 parameters; a rank
slowed in data loading, forward or after backward gets fewer samples (its waits in every all-gather and
reduce-scatter not counted as work); 4 ranks of capacities 1, 1, 0.5, 0.25 split as their capacities; the settings
FSDP2 needs set by the LoadBalancer and a contradicting one refused; torch.distributed.checkpoint with the sharded
model and optimizer, resumed at another world size (4 -> 3). The loss left to the reduce-scatter: test_fsdp_loss.py."""

import os
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import (
    CLASSES,
    DIM,
    N,
    appears,
    assert_equal_to_one_process,
    data,
    dump_rank,
    finish,
    fixed_metrics,
    fsdp2_or_skip,
    full_params,
    init,
    load_ranks,
    make_model,
    native_expected,
    one_process,
    shard,
    spawn,
)

from lbbsp.torch import LoadBalancer

fsdp = fsdp2_or_skip()  # torch.distributed.fsdp, or the module skipped


# ---- exactness ----


def _exact_worker(rank, world, store, out, hsdp, lag, micro, compiled=False, path="auto"):
    init(rank, world, store)
    os.environ["LBBSP_TORCH_NATIVE"] = path  # "0": the Python reduce-scatter, the C++ path's reference
    x, y = data()
    model = shard(make_model(), world, hsdp)
    if compiled:  # the LoadBalancer takes the compiled wrapper and reaches the sharded module inside it
        model = torch.compile(model, backend="eager")
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:5", seed=3, monitor=fixed_metrics,
                      lag=lag, micro_batches=micro)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sizes = []
    for g in range(2 * lb.steps_per_epoch):
        sizes.append(lb.batch_sizes.tolist())
        parts = lb.micro_indices(*divmod(g, lb.steps_per_epoch))
        for i, idx in enumerate(parts):
            model.set_requires_gradient_sync(i == len(parts) - 1)  # reduce-scatter once, after the last
            idx = torch.from_numpy(idx)
            lb.scale(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"), reduction="sum").backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    np.save(os.path.join(out, f"fsdp-{rank}.npy"), full_params(model))
    dump_rank(out, "fsdp", rank, {"sizes": sizes, "gathers": lb.exchange.gathers, "rides": lb.exchange.rides,
                                  "one_call": lb.native.one_call_steps if lb.native is not None else None})
    finish()


@pytest.mark.parametrize("world,hsdp,lag,micro,compiled,path", [
    (3, False, 0, 1, False, "auto"), (3, False, 0, 1, False, "0"), (4, False, 1, 1, False, "auto"),
    (4, True, 0, 1, False, "auto"), (4, True, 2, 1, False, "auto"), (3, False, 0, 2, False, "auto"),
    (3, False, 0, 1, True, "auto")],
    ids=["fsdp3", "fsdp3-python", "fsdp4-lag1", "hsdp4", "hsdp4-lag2", "fsdp3-accumulate", "fsdp3-compiled"])
def test_fsdp_equals_one_process(tmp_path, world, hsdp, lag, micro, compiled, path):
    """random:5 gives some rank 0 samples (it still runs forward and backward, so every collective matches);
    the reductions are SUMs, each rank's loss its share: the parameters equal one process's to 1e-10. Also with
    the sharded model wrapped by torch.compile (the eager backend: Dynamo's tracing without a compiler). A 1-D
    mesh without micro-batches runs the C++ step path (its reduce-scatter, its step() in one call); "python"
    the Python path, its reference."""
    spawn(_exact_worker, world, tmp_path, hsdp, lag, micro, compiled, path)
    got = load_ranks(tmp_path, "fsdp", world)
    sizes = np.array(got[0]["sizes"])
    assert all(g["sizes"] == got[0]["sizes"] for g in got), "the ranks disagree on the sizes"
    assert (sizes == 0).any() and (sizes.sum(axis=1) == 24).all(), sizes
    # one report per step: in the step's last reduce-scatter (one gloo group of the balanced ranks), else (HSDP:
    # the reduce-scatter spans a replica's ranks only) in an all-gather at the end of backward
    reports = {"rides": 0 if hsdp else len(sizes), "gathers": len(sizes) if hsdp else 0}
    assert all({key: g[key] for key in reports} == reports for g in got), got
    native = native_expected(path) and not hsdp and micro == 1
    assert all(g["one_call"] == (len(sizes) if native else None) for g in got), [g["one_call"] for g in got]
    ref = one_process(len(sizes), 24)
    assert_equal_to_one_process(ref, [tmp_path / f"fsdp-{r}.npy" for r in range(world)])


def _frozen_worker(rank, world, store, out, path):
    """The first layer frozen: backward never reaches it, so a step has fewer reduce-scatters than FSDP groups."""
    init(rank, world, store)
    os.environ["LBBSP_TORCH_NATIVE"] = path
    x, y = data()
    net = make_model()
    net[0].requires_grad_(False)
    model = shard(net, world)
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:5", seed=3, monitor=fixed_metrics)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
    steps = 2 * lb.steps_per_epoch
    for g in range(steps):
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        lb.scale(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"), reduction="sum").backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    np.save(os.path.join(out, f"fsdp-{rank}.npy"), full_params(model))
    dump_rank(out, "frozen", rank, {"steps": steps, "rides": lb.exchange.rides, "gathers": lb.exchange.gathers,
                                    "native": lb.native is not None})
    finish()


@pytest.mark.parametrize("path", ["auto", "0"], ids=["native", "python"])
def test_fsdp_frozen_layer_report_leaves_without_riding(tmp_path, path):
    """Where a step runs fewer reduce-scatters than the model has FSDP groups (a frozen layer), no reduce-scatter is
    the step's last by count: the report never rides, it takes the all-gather (from step() on the C++ path, at the
    end of backward on the Python one), every step, and training equals one process with that layer frozen."""
    spawn(_frozen_worker, 3, tmp_path, path)
    got = load_ranks(tmp_path, "frozen", 3)
    assert all(g["rides"] == 0 and g["gathers"] == g["steps"] for g in got), got
    assert all(g["native"] == native_expected(path) for g in got), got
    ref = one_process(got[0]["steps"], 24, frozen=1)
    assert_equal_to_one_process(ref, [tmp_path / f"fsdp-{r}.npy" for r in range(3)])


def _mixed_worker(rank, world, store, out):
    init(rank, world, store)
    x, _ = data()
    y = x[:, :CLASSES].argmax(dim=1)  # learnable labels: the loss can fall far
    policy = fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = shard(make_model().float(), world, mp_policy=policy)
    lb = LoadBalancer(model, dataset_size=N, global_batch=40, balancer="random:2", seed=3, monitor=fixed_metrics)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    sizes, losses = [], []
    for g in range(6 * lb.steps_per_epoch):
        sizes.append(lb.batch_sizes.tolist())
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        loss = lb.scale(F.cross_entropy(model(x[idx].float()), y[idx], reduction="sum"), reduction="sum")
        loss.backward()
        summed = loss.detach().float()
        dist.all_reduce(summed)  # the global batch's mean loss
        losses.append(summed.item())
        opt.step()
        opt.zero_grad()
        lb.step()
    dump_rank(out, "mixed", rank, {"sizes": sizes, "losses": losses})
    finish()


def test_fsdp_bf16_parameters_same_sizes_and_loss_falls(tmp_path):
    """MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32): not exact, but every rank holds the same
    sizes and the global batch's loss falls."""
    spawn(_mixed_worker, 3, tmp_path)
    got = load_ranks(tmp_path, "mixed", 3)
    assert all(g["sizes"] == got[0]["sizes"] for g in got), "the ranks disagree on the sizes"
    losses = np.array(got[0]["losses"])
    assert np.isfinite(losses).all()
    assert losses[-6:].mean() < 0.8 * losses[:6].mean(), losses


# ---- measurement: the waits inside the step are not work ----


class _SlowForward(torch.nn.Module):
    """The model, sleeping `cost` seconds per sample of its input in forward."""

    def __init__(self, net, cost):
        super().__init__()
        self.net, self.cost = net, cost

    def forward(self, x):
        time.sleep(len(x) * self.cost)
        return self.net(x)


class _SlowDataset(torch.utils.data.Dataset):
    def __init__(self, x, y, cost):
        self.x, self.y, self.cost = x, y, cost

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.cost)
        return self.x[i], self.y[i]


def _where_worker(rank, world, store, out, where, capacities, cost_s=3e-4):
    init(rank, world, store)
    cost = cost_s / capacities[rank]  # seconds per sample, in `where`
    g = np.random.default_rng(1)
    x, y = torch.from_numpy(g.normal(size=(64 * 30, DIM))), torch.from_numpy(g.integers(0, CLASSES, 64 * 30))
    model = shard(_SlowForward(make_model(), cost if where == "forward" else 0.0), world)
    lb = LoadBalancer(model, dataset_size=len(x), global_batch=64, balancer="lbbsp-cpu", predictor="ema", seed=1,
                      monitor=fixed_metrics)
    loader = lb.data_loader(_SlowDataset(x, y, cost if where == "load" else 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for xb, yb in loader:
        lb.scale(F.cross_entropy(model(xb), yb)).backward()
        if where == "after_backward":
            time.sleep(len(xb) * cost)
        opt.step()
        opt.zero_grad()
        lb.step()
    if rank == 0:
        np.save(os.path.join(out, f"where-{where}.npy"), lb.batch_sizes)
    finish()


@pytest.mark.parametrize("where", ["load", "forward", "after_backward"])
def test_fsdp_rank_slowed_anywhere_gets_fewer_samples(tmp_path, where):
    """The last of 3 ranks 5x slower in data loading, in forward (between the layers' all-gathers) or after
    backward (before the optimizer): it ends with under half a fast rank's samples."""
    spawn(_where_worker, 3, tmp_path, where, (1.0, 1.0, 0.2))
    sizes = np.load(tmp_path / f"where-{where}.npy")
    assert sizes.sum() == 64
    assert sizes[2] < 0.5 * min(sizes[0], sizes[1]), (where, sizes)


def test_fsdp_four_ranks_split_as_their_capacities(tmp_path):
    """Capacities 1, 1, 0.5, 0.25 (emulated in forward): the split ends within 20% (or 3 samples) of the
    capacities' proportions, 64 x c / sum(c) = 23.3, 23.3, 11.6, 5.8. 1 ms a sample at capacity 1: at 0.3 ms the
    emulated work was about the size of the step's own noise with 4 ranks on 2 cores beside another test, and
    the split was still short of the capacities after the run's 30 steps in 3 of 12 runs (0 of 28 at 1 ms)."""
    capacities = (1.0, 1.0, 0.5, 0.25)
    spawn(_where_worker, 4, tmp_path, "forward", capacities, 1e-3)
    sizes = np.load(tmp_path / "where-forward.npy")
    ideal = 64 * np.array(capacities) / sum(capacities)
    assert sizes.sum() == 64
    assert (np.abs(sizes - ideal) <= np.maximum(3, 0.2 * ideal)).all(), (sizes, ideal)


# ---- settings ----


def _settings_worker(rank, world, store, out):
    init(rank, world, store)
    model = shard(make_model(), world)
    model[0].set_gradient_divide_factor(2.0)
    errors = {}
    try:
        LoadBalancer(model, dataset_size=N, global_batch=24, monitor=fixed_metrics)
    except ValueError as e:
        errors["factor"] = str(e)
    model[0].set_gradient_divide_factor(1.0)
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, monitor=fixed_metrics)
    groups = [g for m in model.modules() if isinstance(m, fsdp.FSDPModule)
              for g in m._get_fsdp_state()._fsdp_param_groups]
    set_by_lb = {"factor": sorted({g.gradient_divide_factor for g in groups}),
                 "sum": sorted({g.force_sum_reduction_for_comms for g in groups}), "groups": len(groups)}
    fsdp1 = fsdp.FullyShardedDataParallel.__new__(fsdp.FullyShardedDataParallel)  # FSDP1 needs a GPU to build
    torch.nn.Module.__init__(fsdp1)
    try:
        LoadBalancer(fsdp1, dataset_size=N, global_batch=24, monitor=fixed_metrics)
    except TypeError as e:
        errors["fsdp1"] = str(e)
    del lb
    dump_rank(out, "settings", rank, {"errors": errors, "set": set_by_lb})
    finish()


def test_fsdp_settings_set_and_contradictions_refused(tmp_path):
    spawn(_settings_worker, 2, tmp_path)
    got = load_ranks(tmp_path, "settings", 2)
    for g in got:
        assert "gradient divide factor 2.0" in g["errors"]["factor"] and "must be 1" in g["errors"]["factor"], g
        assert "FSDP1" in g["errors"]["fsdp1"] and "fully_shard" in g["errors"]["fsdp1"], g
        assert g["set"] == {"factor": [1.0], "sum": [True], "groups": 2}, g["set"]


# ---- state: torch.distributed.checkpoint beside the sharded model and optimizer, 4 ranks -> 3 ----


def _dcp_worker(rank, world, store, out, phase):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    init(rank, world, store)
    x, y = data()
    model = shard(make_model(), world)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:5", seed=3, monitor=fixed_metrics)
    ckpt = os.path.join(out, "dcp")
    if phase == "resume":
        model_state, opt_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": opt_state, "lb": lb.state_dict()}
        dcp.load(state, checkpoint_id=ckpt)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        lb.load_state_dict(state["lb"])
    first = lb.global_step
    for g in range(first, first + 10):
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        lb.scale(F.cross_entropy(model(x[idx]), y[idx], reduction="sum"), reduction="sum").backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    if phase == "save":
        model_state, opt_state = get_state_dict(model, opt)
        dcp.save({"model": model_state, "optim": opt_state, "lb": lb.state_dict()}, checkpoint_id=ckpt)
    np.save(os.path.join(out, f"dcp-{phase}-{rank}.npy"), full_params(model))
    dump_rank(out, f"dcp-{phase}", rank, {"steps": lb.global_step})
    finish()


def test_fsdp_resumes_at_another_world_size_with_dcp(tmp_path):
    """10 steps on 4 ranks, saved with torch.distributed.checkpoint (the sharded model, the optimizer's momentum,
    the balancer), 10 more on 3 ranks: equal to one process's 20 steps."""
    spawn(_dcp_worker, 4, tmp_path, "save")
    spawn(_dcp_worker, 3, tmp_path, "resume")
    assert [g["steps"] for g in load_ranks(tmp_path, "dcp-resume", 3)] == [20] * 3
    assert_equal_to_one_process(one_process(20, 24), [tmp_path / f"dcp-resume-{r}.npy" for r in range(3)])



# ---- step() waits for no rank's work after backward ----


def _no_wait_worker(rank, world, store, out, lag):
    init(rank, world, store)
    x, y = data()
    model = shard(make_model(), world)
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="lbbsp-cpu", predictor="ema", lag=lag,
                      monitor=fixed_metrics, timeout_s=30)
    stepped = os.path.join(out, f"stepped-{lag}")
    result = "finished"
    try:
        for g in range(6):
            idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
            lb.scale(F.cross_entropy(model(x[idx]), y[idx])).backward()
            if rank == 1 and g == 3 and not appears(stepped):  # rank 1 holds on until rank 0 is through step()
                result = "rank 0 did not get through step() while rank 1 held on"
            lb.step()
            if rank == 0 and g == 3:
                open(stepped, "w").close()
    except RuntimeError as e:
        result = str(e)
    dump_rank(out, f"nowait-{lag}", rank, result)
    finish()


@pytest.mark.parametrize("lag", [0, 1])
def test_fsdp_step_does_not_wait_for_work_after_backward(tmp_path, lag):
    """The report leaves at the end of backward: rank 0's step() goes through while rank 1 holds on after its
    backward (with lag 0 too: rank 1's report of the step has left)."""
    spawn(_no_wait_worker, 2, tmp_path, lag)
    assert load_ranks(tmp_path, f"nowait-{lag}", 2) == ["finished", "finished"]
