"""lbbsp.torch's DataLoader side on real gloo process groups: a DataLoader with workers and lag (and a clear
error when it prefetches past what is decided), an HDF5 dataset read by 2 persistent workers over epochs and
resumed mid-epoch equal to one process (with the sampler's and data_loader()'s errors), a loop without lb.step()
said so, batches not from the balancer warned about, and the lag a loader needs. The shared harness is
harness.py."""

import os
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from harness import (
    TORCH2,
    N,
    data,
    dump_rank,
    finish,
    fixed_metrics,
    init,
    load_ranks,
    make_model,
    one_process,
    read_pickle,
    spawn,
    write_pickle,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from lbbsp.torch import LoadBalancer

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
    result = {"lengths": lengths, "sizes": sizes, "one_call": lb.native.one_call_steps if lb.native else None}
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
    # On the C++ step path every step() went its usual course in one call, with the lag the loader raised to and
    # after the resume (the state re-armed by raise_lag and load_state_dict)
    native = TORCH2 and os.environ.get("LBBSP_TORCH_NATIVE", "auto") != "0"
    assert [(f["one_call"], g["one_call"]) for f, g in zip(first, resumed)] == [(13, 7) if native else (None, None)] * 2
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


def test_micro_sizes_and_the_lag_a_loader_needs():
    from lbbsp.torch import required_lag
    assert required_lag(2, 2, micro_batches=1) == 4
    assert required_lag(2, 2, micro_batches=3) == 2  # 4 micro-batches ahead are 2 steps at most
    assert required_lag(0, micro_batches=3) == 0
    with pytest.raises(ValueError, match="micro_batches"):
        required_lag(2, micro_batches=0)
