"""lbbsp.torch's errors, warnings and hangs on real gloo process groups: a hung rank named by the others'
timeout, an exception on one rank ending all with it named, a rank using another batch vector named (by its global
rank in a subgroup), only collective errors taken for a hung peer, init_from_env's timeout, and the warnings for
plain BatchNorm and an unscaled mean loss (construction arguments: test_torch_args.py). The shared harness is
harness.py."""

import datetime
import gc
import os
import time
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from harness import (
    CLASSES,
    DIM,
    TORCH2,
    N,
    data,
    finish,
    fixed_metrics,
    init,
    load_ranks,
    make_model,
    read_pickle,
    resolved_start_method,
    spawn,
    write_pickle,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from lbbsp.torch import LoadBalancer

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


# ---- the common mistake, an unscaled mean loss, warns ----


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
                          monitor=fixed_metrics, check_loss=name != "opted_out", loss_reduction=None)
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
        result[name] = [str(w.message) for w in caught if "lb.scale" in str(w.message)]
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
    """loss_reduction=None: every step's loss must go through lb.scale(); a step without it warns."""
    spawn(_loss_check_worker, 2, tmp_path)
    for r in range(2):
        got = read_pickle(tmp_path / f"loss-{r}.pkl")
        assert len(got["unscaled"]) == 1 and "reduction='mean'" in got["unscaled"][0], got
        assert got["scaled"] == got["sum"] == got["opted_out"] == [], got
        assert "must be a scalar tensor" in got["vector"], got
        assert len(got["dropped"]) == 1 and "LoadBalancer is gone" in got["dropped"][0], got["dropped"]


# ---- an exception on a non-zero rank in step() ends every rank, naming it ----


def _failing_worker(rank, world, store, out, lag, ddp=False):
    init(rank, world, store)
    calls = [0]
    model = DDP(make_model()) if ddp else None  # with DDP the hook sends the reports (the C++ one on PyTorch 2.x)
    x, y = data()

    def monitor():
        calls[0] += 1
        if rank == 2 and calls[0] == 4:
            raise OSError("sensor exploded")
        return [1.0, 0.5, 0.0]

    lb = LoadBalancer(model, dataset_size=N, global_batch=30, balancer="lbbsp-cpu", timeout_s=20,
                      monitor=monitor, lag=lag)
    t0 = time.time()
    result = "finished"
    try:
        for g in range(10):
            lb.record_compute(1e-3)
            if model is not None:
                idx = torch.from_numpy(lb.indices(*divmod(g, lb.steps_per_epoch)))
                lb.scale(F.cross_entropy(model(x[idx]), y[idx])).backward()
            lb.step()
    except RuntimeError as e:
        result = str(e)
    took = time.time() - t0
    dist.barrier()  # every process stays alive until all have their answer: no rank ends by another's death
    one_call = lb.native.one_call_steps if lb.native is not None else None
    write_pickle(os.path.join(out, f"fail-{lag}-{rank}.pkl"), (result, took, one_call))
    finish()


# with lag >= 1 step 3 is decided after later steps' reports were built; with DDP (lag 0) the other ranks' one
# call of step() (lbbsp.torch.native.decide_step) meets rank 2's failed row and leaves the rows to the Python path
@pytest.mark.parametrize("lag, ddp", [(0, False), (2, False), (0, True)])
def test_error_on_nonzero_rank_ends_every_rank_naming_it(tmp_path, lag, ddp):
    spawn(_failing_worker, 3, tmp_path, lag, ddp)
    for r in range(3):
        msg, took, one_call = read_pickle(tmp_path / f"fail-{lag}-{r}.pkl")
        expected = "LoadBalancer: step 3: rank 2 failed in its report: rank 2: OSError: sensor exploded"
        assert msg.startswith(expected), msg
        assert took < 20, f"rank {r} took {took:.1f} s, more than timeout_s"
        # steps 0-2 in one call each on the C++ path, step 3 the Python way
        native = ddp and TORCH2 and os.environ.get("LBBSP_TORCH_NATIVE", "auto") != "0"
        assert one_call == (3 if native else None), one_call


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
                lb.sizes.decide(g, lb.sizes[g] + np.eye(lb.world_size, dtype=np.int64)[0] - np.eye(
                    lb.world_size, dtype=np.int64)[-1])
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
