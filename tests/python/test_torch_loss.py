"""The loss's weight on a rank, two ways: lb.scale(loss), or loss_reduction (the DDP hook weights the rank's
gradients, in C++ on lbbsp.torch's step path or on the Python one): a mean loss with an L2 term equals one process
either way (0-sample ranks included, a sum loss alike); loss_reduction's refusals, its rows check at step(),
scale() raising under it, and the dropped LoadBalancer's averaging hook. The shared harness is harness.py."""

import copy
import gc
import os
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from harness import (
    TORCH2,
    N,
    assert_equal_to_one_process,
    construction_errors,
    data,
    finish,
    fixed_metrics,
    init,
    make_model,
    native_expected,
    one_process,
    read_pickle,
    spawn,
    sum_of_squares,
    write_pickle,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from lbbsp.torch import LoadBalancer

if TORCH2:  # importing torch.distributed.fsdp fails on 1.13 under Python 3.11 (a dataclass default)
    from torch.distributed import fsdp as _fsdp
HAS_FSDP2 = TORCH2 and hasattr(_fsdp, "fully_shard")

# ---- a mean loss with an L2 term, through lb.scale or weighted in the hook, equals one process ----

L2 = 1e-2


def _mean_worker(rank, world, store, out, steps, global_batch, reduction, scaled, path):
    init(rank, world, store)
    os.environ["LBBSP_TORCH_NATIVE"] = path
    x, y = data()
    model = DDP(make_model())
    chosen = {} if reduction == "auto" else {"loss_reduction": reduction}  # "auto": the default
    lb = LoadBalancer(model, dataset_size=N, global_batch=global_batch, balancer="random:5", seed=3,
                      monitor=fixed_metrics, check_loss=scaled != "hand", **chosen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sizes = []
    for g in range(steps):
        idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
        sizes.append(lb.batch_sizes.tolist())
        logits = model(x[idx])
        if reduction == "sum":  # the sum over the rank's samples: its L2 term weighted by n_r, as one process's
            loss = F.cross_entropy(logits, y[idx], reduction="sum") + len(idx) * L2 * sum_of_squares(model.module)
        elif scaled == "hand":  # weighted by hand: the sum over the rank's samples / X, its L2 term n_r / X
            loss = (F.cross_entropy(logits, y[idx], reduction="sum") +
                    len(idx) * L2 * sum_of_squares(model.module)) / global_batch
        else:
            loss = F.cross_entropy(logits, y[idx]) + L2 * sum_of_squares(model.module)
        if scaled == "always" or (scaled == "even" and g % 2 == 0):
            loss = lb.scale(loss)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lb.step()
    params = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy()
    np.save(os.path.join(out, f"mean-{rank}.npy"), params)
    write_pickle(os.path.join(out, f"mean-sizes-{rank}.pkl"), (sizes, lb.native is not None))
    finish()


@pytest.mark.parametrize("reduction, scaled, path", [
    (None, "always", "auto"),  # lb.scale every step
    ("auto", "never", "auto"), ("auto", "never", "0"),  # the default: a plain DDP loop, the hook weights the loss
    ("auto", "even", "auto"), ("auto", "even", "0"),  # lb.scale on some steps: the hook leaves those alone
    ("auto", "hand", "auto"),  # the loss weighted by hand, check_loss=False: the hook weights nothing
    ("mean", "never", "auto"), ("mean", "never", "0"), ("sum", "never", "auto")])
def test_mean_loss_with_l2_equals_one_process(tmp_path, reduction, scaled, path):
    """A mean loss with an L2 term, through lb.scale or left as it is with loss_reduction (the hook weights the
    gradients, in C++ or on the Python path; a sum loss alike), equals one process, 0-sample ranks included."""
    world, steps, X = 3, 20, 24
    spawn(_mean_worker, world, tmp_path, steps, X, reduction, scaled, path)
    sizes, native_path = read_pickle(tmp_path / "mean-sizes-0.pkl")
    assert native_path == native_expected(path)
    assert (np.array(sizes) == 0).any(), "random:5 gave no 0-sample rank: the test lost its point"
    ref = one_process(steps, X, l2=L2, mean=True)
    assert_equal_to_one_process(ref, [tmp_path / f"mean-{r}.npy" for r in range(world)])


# ---- loss_reduction's refusals: a clear exception on every rank ----


def _refusals_worker(rank, world, store, out):
    init(rank, world, store)
    plain = DDP(make_model())  # loss_reduction's errors come before any hook is registered
    cases = {
        "reduction": dict(dataset_size=100, global_batch=10, model=plain, loss_reduction="avg"),
        "reduction_no_model": dict(dataset_size=100, global_batch=10, loss_reduction="mean"),
        "reduction_micro": dict(dataset_size=100, global_batch=10, model=plain, loss_reduction="mean",
                                micro_batches=2),
    }
    if HAS_FSDP2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        # one rank per shard (replicas only): FSDP2 copies the gradients, no reduce-scatter to weight them in
        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
        sharded = fully_shard(torch.nn.Linear(2, 2), mesh=mesh)
        cases["reduction_fsdp"] = dict(dataset_size=100, global_batch=10, model=sharded, loss_reduction="sum")
    messages = construction_errors(LoadBalancer, cases)
    write_pickle(os.path.join(out, f"refused-{rank}.pkl"), messages)
    finish()


def test_loss_reduction_refusals_raise_on_every_rank(tmp_path):
    spawn(_refusals_worker, 2, tmp_path)
    m0, m1 = (read_pickle(tmp_path / f"refused-{r}.pkl") for r in range(2))
    assert m0 == m1
    assert m0["reduction"] == ("ValueError: LoadBalancer: loss_reduction must be 'auto', 'mean', 'sum' or None, "
                               "got 'avg'")
    refused = ["reduction_no_model"] + (["reduction_fsdp"] if HAS_FSDP2 else [])
    for name in refused:  # no model, or FSDP2 without a reduce-scatter: nowhere to weight the gradients in
        assert m0[name].startswith("ValueError: LoadBalancer: loss_reduction=") and \
            "an FSDP2 model's reduce-scatter: it needs one of them" in m0[name], m0[name]
    assert "loss_reduction='mean' needs micro_batches=1" in m0["reduction_micro"], m0["reduction_micro"]


# ---- under loss_reduction: the rows check, scale() refused, the orphaned hook ----


def _hook_weighted_worker(rank, world, store, out, reduction, path):
    """The loss left to the hook ('mean', or 'auto' without scale()): a plain mean loss does not warn, a forward on
    other rows than the rank's share does (once, at step()), scale() raises under 'mean', and the dropped
    LoadBalancer's hook averages as DDP does."""
    init(rank, world, store)
    os.environ["LBBSP_TORCH_NATIVE"] = path
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:2", seed=1, monitor=fixed_metrics,
                      loss_reduction=reduction)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for g in range(4):
            share = int(lb.batch_sizes[lb.rank])
            idx = torch.from_numpy(lb.indices(0, g)) if g < 2 else torch.arange(share + 1)  # steps 2, 3: wrong rows
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            lb.step()
    result = {"weighted": [str(w.message) for w in caught], "native": lb.native is not None}
    try:
        lb.scale(torch.zeros(()))
        result["weighted_scale"] = "no error"
    except RuntimeError as e:
        result["weighted_scale"] = str(e)
    lb = None
    gc.collect()
    model.zero_grad()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        F.cross_entropy(model(x[8 * rank:8 * rank + 8]), y[8 * rank:8 * rank + 8]).backward()  # 8 rows a rank
    result["weighted_dropped"] = [str(w.message) for w in caught if "LoadBalancer" in str(w.message)]
    alone = copy.deepcopy(model.module)  # DDP's average of two equal means: the mean over both ranks' 16 rows
    alone.zero_grad()
    F.cross_entropy(alone(x[:16]), y[:16]).backward()
    result["dropped_vs_average"] = max(float((p.grad - q.grad).abs().max())
                                       for p, q in zip(model.module.parameters(), alone.parameters()))
    write_pickle(os.path.join(out, f"weighted-{rank}.pkl"), result)
    finish()


@pytest.mark.parametrize("reduction, path", [("mean", "auto"), ("mean", "0"), ("auto", "auto"), ("auto", "0")])
def test_hook_weighted_loss_checks(tmp_path, reduction, path):
    spawn(_hook_weighted_worker, 2, tmp_path, reduction, path)
    for r in range(2):
        got = read_pickle(tmp_path / f"weighted-{r}.pkl")
        assert got["native"] == native_expected(path)
        weighted = got["weighted"]
        assert len(weighted) == 1 and weighted[0].startswith("LoadBalancer.step: step 2: the model's last forward"), \
            weighted
        fix = "pass check_loss=False" if reduction == "mean" else "pass loss_reduction='mean' and check_loss=False"
        assert weighted[0].endswith(fix), weighted
        if reduction == "mean":
            assert "has loss_reduction='mean'" in got["weighted_scale"], got["weighted_scale"]
        else:
            assert got["weighted_scale"] == "no error", got["weighted_scale"]
        assert len(got["weighted_dropped"]) == 1 and "averages the gradients as DDP does" in \
            got["weighted_dropped"][0], got["weighted_dropped"]
        assert got["dropped_vs_average"] < 1e-6, got["dropped_vs_average"]


# ---- "auto": a step scaled before a load_state_dict is not taken for the same step after it ----


def _reloaded_worker(rank, world, store, out, path):
    init(rank, world, store)
    os.environ["LBBSP_TORCH_NATIVE"] = path
    x, y = data()
    model = DDP(make_model())
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:2", seed=1, monitor=fixed_metrics)

    def gradients(scaled):  # no optimizer step: the parameters stay, so step 3's gradients can be compared
        idx = torch.from_numpy(lb.indices(0, lb.global_step))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        (lb.scale(loss) if scaled else loss).backward()
        grads = torch.cat([p.grad.flatten() for p in model.module.parameters()])
        model.zero_grad()
        lb.step()
        return grads
    for _ in range(3):
        gradients(scaled=True)
    saved = lb.state_dict()  # at step 3
    through_scale = gradients(scaled=True)
    lb.load_state_dict(saved)
    through_hook = gradients(scaled=False)  # step 3 again, the loss left to the hook
    write_pickle(os.path.join(out, f"reloaded-{rank}.pkl"), float((through_scale - through_hook).abs().max()))
    finish()


@pytest.mark.parametrize("path", ["auto", "0"])
def test_scaled_step_does_not_outlive_a_load(tmp_path, path):
    spawn(_reloaded_worker, 2, tmp_path, path)
    for r in range(2):
        assert read_pickle(tmp_path / f"reloaded-{r}.pkl") < 1e-12
