"""lbbsp.torch's state and resume on real gloo process groups: a resume from state_dict continues identically
(a state of the unreleased version 2 refused), the state is the same on every rank and loads at another world
size equal to one process, torch.distributed.checkpoint saves and loads it (another lag, another world size), and
examples/torch_fmnist.py resumes its checkpoint at another world size. The shared harness is harness.py."""

import os
import pickle
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from harness import (
    TORCH2,
    N,
    assert_equal_to_one_process,
    data,
    dump_rank,
    finish,
    fixed_metrics,
    init,
    load_ranks,
    make_model,
    one_process,
    read_pickle,
    source_dir,
    spawn,
    synth_images,
    write_pickle,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from lbbsp.torch import LoadBalancer

# ---- resume from state_dict continues identically ----


def _resume_worker(rank, world, store, out, phase):
    init(rank, world, store)
    lb = LoadBalancer(None, dataset_size=1000, global_batch=40, balancer="lbbsp-cpu", predictor="narx", seed=2,
                      lag=1, monitor=fixed_metrics)
    speed = [1000.0, 400.0][rank]
    start = 0
    if phase != "first":
        state = torch.load(os.path.join(out, "lb.pt"))
        if phase == "resume_v2":  # a state of an unreleased layout (the sizes keyed by step): refused
            state["version"], state["sizes"] = 2, {state["step"] + i: v for i, v in enumerate(state["sizes"])}
            try:
                lb.load_state_dict(state)
            except ValueError as e:
                write_pickle(os.path.join(out, f"resume-{phase}-{rank}.pkl"), str(e))
            finish()
            return
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
    spawn(_resume_worker, 2, tmp_path, "resume")
    resumed = read_pickle(tmp_path / "resume-resume.pkl")
    assert len(resumed) == 18
    assert first[12:] == resumed
    assert first[-1][0] > first[-1][1], "the faster rank should carry more"
    spawn(_resume_worker, 2, tmp_path, "resume_v2")
    for r in range(2):
        message = read_pickle(tmp_path / f"resume-resume_v2-{r}.pkl")
        assert "the state is version 2, this lbbsp reads version 3" in message and "afresh" in message, message


# ---- the same state on every rank; a state saved at 4 ranks mid-epoch continues at 3, equal to one process ----


def _world_change_worker(rank, world, store, out, phase, stop):
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


# ---- examples/torch_fmnist.py: HDF5 through DataLoader workers, validation, a checkpoint resumed at another size ----


def test_example_trainer_resumes_at_another_world_size(tmp_path):
    import subprocess
    import sys as _sys
    src = source_dir()
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
