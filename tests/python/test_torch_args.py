"""lbbsp.torch's construction arguments on real gloo process groups: a bad argument raises a clear exception on
every rank, also when it is bad on one rank only (the others name it, at once), ranks built unlike each other
(another dataset_size, seed, model, model group) raise on every rank, and init_process_group must come first. The
shared harness is harness.py."""

import os

import pytest
import torch
import torch.distributed as dist
from harness import (
    TORCH2,
    N,
    construction_errors,
    dump_rank,
    finish,
    fixed_metrics,
    init,
    load_ranks,
    make_model,
    read_pickle,
    spawn,
    write_pickle,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from lbbsp.torch import LoadBalancer

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
    if TORCH2:  # FSDP1 on the CPU (FSDP2, fully_shard, is supported: test_fsdp.py)
        from torch.distributed import fsdp
        cases["fsdp1"] = dict(dataset_size=100, global_batch=10, model=fsdp.FullyShardedDataParallel(
            torch.nn.Linear(2, 2), device_id=torch.device("cpu")))
    hooked = DDP(make_model())  # a hook of the user's already there: DDP takes one
    hooked.register_comm_hook(None, lambda state, bucket: dist.all_reduce(bucket.buffer(), async_op=True)
                              .get_future().then(lambda f: f.value()[0]))
    cases["hooked"] = dict(dataset_size=100, global_batch=10, model=hooked)
    messages = construction_errors(LoadBalancer, cases)
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
    if TORCH2:
        assert m0["fsdp1"].startswith("TypeError: LoadBalancer: FullyShardedDataParallel (FSDP1) is not supported: "
                                      "apply fully_shard"), m0["fsdp1"]
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
    # arguments that raise on one rank only: the others must raise too, at once (not after timeout_s)
    cases["refused_on_one"] = dict(model=None, dataset_size=N, global_batch=0 if rank == 1 else 24)
    cases["timeout_on_one"] = dict(model=None, dataset_size=N, global_batch=24, timeout_s=-1 if rank == 2 else 30)
    cases["monitor_on_one"] = dict(model=None, dataset_size=N, global_batch=24, monitor="cpu" if rank == 3 else None)
    cases["refused_in_pair"] = dict(model=None, dataset_size=N, global_batch=0 if rank == 3 else 24, process_group=pair)
    messages = {}
    for name, kwargs in cases.items():
        try:
            LoadBalancer(**{"monitor": fixed_metrics, "timeout_s": 30, **kwargs})
            messages[name] = "built"
        except (ValueError, TypeError) as e:
            messages[name] = f"{type(e).__name__}: {e}"
    dump_rank(out, "mismatch", rank, messages)
    finish()


def test_ranks_built_alike_or_every_rank_raises(tmp_path):
    spawn(_mismatch_worker, 4, tmp_path)
    got = load_ranks(tmp_path, "mismatch", 4)
    one_rank = ("refused_on_one", "timeout_on_one", "monitor_on_one")
    for name, culprit, why in zip(one_rank, (1, 2, 3), ("ValueError: LoadBalancer: global_batch must be >= 1",
                                                        "ValueError: LoadBalancer: timeout_s must be a positive",
                                                        "TypeError: LoadBalancer: monitor must be callable")):
        assert got[culprit][name].startswith(why), got[culprit][name]  # its own error, as it raised it
        for r in set(range(4)) - {culprit}:
            assert got[r][name].startswith(f"ValueError: LoadBalancer: every rank stops: rank {culprit} could not "
                                           f"build its LoadBalancer ({why}"), got[r][name]
            assert got[r][name].endswith(". Fix that rank's arguments"), got[r][name]
    # in data-parallel pairs: rank 3's refusal stops its pair (named by its global rank), not the other pair
    assert [g["refused_in_pair"].split(":")[0] for g in got] == ["built", "built", "ValueError", "ValueError"], got
    assert got[2]["refused_in_pair"].startswith("ValueError: LoadBalancer: every rank stops: rank 3 could not build"), \
        got[2]["refused_in_pair"]
    one_rank += ("refused_in_pair",)
    got = [{k: v.removeprefix("ValueError: ") for k, v in g.items() if k not in one_rank} for g in got]
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
