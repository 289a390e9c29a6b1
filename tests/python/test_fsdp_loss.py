"""lbbsp.torch's loss weight and report under FSDP2 (gloo, float64): a plain mean loss left to the reduce-scatter
equals one process (FSDP and HSDP, 0-sample ranks, scale() on some steps, loss_reduction='sum'); a dropped
LoadBalancer's reduce-scatter averages as plain FSDP2's; an error in a report that rides in the last reduce-scatter
ends every rank. The rest of FSDP2's tests: test_fsdp.py."""

import gc
import os
import time
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import (
    N,
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


# ---- the loss left to the reduce-scatter, the dropped LoadBalancer, a riding report's error ----


def _mean_worker(rank, world, store, out, hsdp, reduction, scaled, path):
    """A mean loss as a plain FSDP2 loop writes it, left to the reduce-scatter's weight (scale() on some steps or
    none), or a sum loss under loss_reduction='sum'. path "0": the weight in Python, the C++ path's reference."""
    init(rank, world, store)
    os.environ["LBBSP_TORCH_NATIVE"] = path
    x, y = data()
    model = shard(make_model(), world, hsdp)
    chosen = {} if reduction == "auto" else {"loss_reduction": reduction}  # "auto": the default
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="random:5", seed=3, monitor=fixed_metrics,
                      **chosen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sizes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for g in range(2 * lb.steps_per_epoch):
            sizes.append(lb.batch_sizes.tolist())
            idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
            loss = F.cross_entropy(model(x[idx]), y[idx], reduction="sum" if reduction == "sum" else "mean")
            (lb.scale(loss) if scaled == "even" and g % 2 == 0 else loss).backward()
            opt.step()
            opt.zero_grad()
            lb.step()
    np.save(os.path.join(out, f"fsdp-{rank}.npy"), full_params(model))
    dump_rank(out, "fsdp", rank, {"sizes": sizes, "reduction": lb.loss.reduction, "native": lb.native is not None,
                                  "warned": [str(w.message) for w in caught]})
    finish()


@pytest.mark.parametrize("world,hsdp,reduction,scaled,path", [
    (3, False, "auto", "never", "auto"), (3, False, "auto", "never", "0"), (4, True, "auto", "never", "auto"),
    (3, False, "auto", "even", "auto"), (3, False, "auto", "even", "0"), (3, False, "sum", "never", "auto")],
    ids=["fsdp3", "fsdp3-python", "hsdp4", "fsdp3-scaled-on-even-steps", "fsdp3-scaled-python", "fsdp3-sum"])
def test_fsdp_mean_loss_left_to_the_reduce_scatter_equals_one_process(tmp_path, world, hsdp, reduction, scaled,
                                                                       path):
    """The default ("auto") weights each rank's gradients n_r / X in the reduce-scatter, before the SUM, where the
    loss did not go through scale(): a plain mean loss equals one process to 1e-10, 0-sample ranks included (their
    gradients zeroed), with HSDP (the all-reduce over replicas sums the weighted shards) and with scale() on some
    steps (those left alone); loss_reduction='sum' weights a sum loss 1 / X alike. No warning. On a 1-D mesh the
    weight is the C++ step path's, else ("python", HSDP) the Python reduce-scatter's."""
    spawn(_mean_worker, world, tmp_path, hsdp, reduction, scaled, path)
    got = load_ranks(tmp_path, "fsdp", world)
    sizes = np.array(got[0]["sizes"])
    assert all(g["sizes"] == got[0]["sizes"] for g in got), "the ranks disagree on the sizes"
    assert (sizes == 0).any(), "random:5 gave no 0-sample rank: the test lost its point"
    assert all(g["reduction"] == reduction and g["warned"] == [] for g in got), got
    assert all(g["native"] == (native_expected(path) and not hsdp) for g in got), got
    ref = one_process(len(sizes), 24, mean=True) if reduction == "auto" else one_process(len(sizes), 24)
    assert_equal_to_one_process(ref, [tmp_path / f"fsdp-{r}.npy" for r in range(world)])


def _dropped_worker(rank, world, store, out):
    """A step with the LoadBalancer, then without it (dropped): one step's gradients against a plain FSDP2 model's
    (its own averaging reduce-scatter) on the same rows."""
    init(rank, world, store)
    x, y = data()
    model, plain = shard(make_model(), world), shard(make_model(), world)
    lb = LoadBalancer(model, dataset_size=N, global_batch=24, monitor=fixed_metrics)
    F.cross_entropy(model(x[:8]), y[:8]).backward()
    lb.step()
    del lb
    gc.collect()
    rows = slice(8 * rank, 8 * rank + 5 + rank)  # unequal rows: DDP's average of the ranks' means
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in (model, plain):
            m.zero_grad()
            F.cross_entropy(m(x[rows]), y[rows]).backward()
    grads = [torch.cat([p.grad.full_tensor().flatten() for p in m.parameters()]) for m in (model, plain)]
    dump_rank(out, "dropped", rank, {"difference": float((grads[0] - grads[1]).abs().max()),
                                     "warned": [str(w.message) for w in caught]})
    finish()


def test_fsdp_dropped_load_balancer_averages_as_plain_fsdp(tmp_path):
    """Once the LoadBalancer is gone its reduce-scatter stays a SUM (FSDP keeps its settings): with the loss left
    to it ("auto") it weights each rank 1 / world, so the gradients are plain FSDP2's average, with one warning."""
    spawn(_dropped_worker, 2, tmp_path)
    for g in load_ranks(tmp_path, "dropped", 2):
        assert g["difference"] < 1e-12, g
        assert len(g["warned"]) == 1 and "averages the gradients as DDP does" in g["warned"][0], g["warned"]


def _failing_worker(rank, world, store, out):
    """Rank 2's monitor raises while its report is built, in the step's last reduce-scatter (the report rides there)."""
    init(rank, world, store)
    x, y = data()
    model, calls = shard(make_model(), world), [0]

    def monitor():
        calls[0] += 1
        if rank == 2 and calls[0] == 4:
            raise OSError("sensor exploded")
        return [1.0, 0.5, 0.0]

    lb = LoadBalancer(model, dataset_size=N, global_batch=24, balancer="lbbsp-cpu", timeout_s=20, monitor=monitor)
    t0, result = time.time(), "finished"
    try:
        for g in range(10):
            idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            lb.step()
    except RuntimeError as e:
        result = str(e)
    took = time.time() - t0
    dist.barrier()  # every process stays alive until all have their answer
    dump_rank(out, "failing", rank, {"result": result, "took": took, "rides": lb.exchange.rides})
    finish()


def test_fsdp_error_in_a_riding_report_ends_every_rank_naming_it(tmp_path):
    spawn(_failing_worker, 3, tmp_path)
    for g in load_ranks(tmp_path, "failing", 3):
        assert g["result"].startswith("LoadBalancer: step 3: rank 2 failed in its report: rank 2: OSError: sensor "
                                      "exploded"), g["result"]
        assert g["took"] < 20 and g["rides"] == 4, g
