"""The shared harness of the Python tests (not a test module: nothing here is collected): ranks started as
processes over a gloo FileStore, their results passed back through pickles, the tests' data and model, the
one-process reference trainer that the balanced ranks must equal, and small process helpers (free ports, the
source tree, synthetic images).

Every test module imports from here and from no other test module. It is found as a top-level module: pytest
(its default import mode, rootdir wherever) puts tests/python, the test files' folder, on sys.path, also in each
pytest-xdist worker; ranks spawned from pytest inherit that sys.path; the scripts the tests start as subprocesses
(test_accelerate.py run as a script, Lightning's launcher script, ending_job.py) have tests/python on sys.path or
in PYTHONPATH."""

import contextlib
import datetime
import itertools
import os
import pickle
import random
import socket
import subprocess
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import lbbsp

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


def fixed_metrics():
    return [1.0, 0.5, 0.0]


def source_dir():
    """The source tree: LBBSP_SOURCE_DIR (the CTest tests set it; they run these files from a scratch folder) or
    the tree this file is in."""
    return os.environ.get("LBBSP_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def free_port():
    """A TCP port free on 127.0.0.1 now (for MASTER_PORT), below the kernel's ephemeral range. A port the kernel
    handed out (bind to 0) is free again once closed, and until rank 0's store binds it the kernel may give it to
    any other socket: a gloo listener of a test running beside (pytest-xdist) took one, the other rank connected to
    it and waited in the store's handshake for good. Ports below the range are never handed out that way."""
    low = _ephemeral_low()
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken: try another
                continue
            return port
    raise RuntimeError(f"free_port: no free port in 10000-{low - 1} after 200 tries")


def _ephemeral_low():
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# ---- ranks as processes ----


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
    at the top of this module, every rank starts at once. The ranks call torch.set_num_threads(1) first
    (init), so they never enter the OpenMP pool this process may have used. start_method="spawn" for ranks that
    use CUDA (which a forked child cannot initialise where its parent has); a spawned rank imports fn's test module
    by name, from the sys.path it inherits."""
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


# ---- results passed back from the ranks ----


def write_pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def read_pickle(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def appears(path, limit_s=60.0):
    """Whether ``path`` exists within ``limit_s`` (looked for every 0.1 s; the limit is a hang guard): a rank
    holding on until another rank has got somewhere."""
    for _ in range(int(limit_s * 10)):
        if os.path.exists(path):
            return True
        time.sleep(0.1)
    return False


def construction_errors(build, cases):
    """{case: "no error" or "Type: message"} for build(model, **kwargs) of each case (its "model" entry, default
    None, passed first): what each set of arguments raised on this rank."""
    messages = {}
    for name, kw in cases.items():
        kw = dict(kw)
        model = kw.pop("model", None)
        try:
            build(model, **kw)
            messages[name] = "no error"
        except (ValueError, TypeError, RuntimeError) as e:
            messages[name] = f"{type(e).__name__}: {e}"
    return messages


def dump_rank(out, name, rank, result):
    """A worker's result, one pickle per rank (read back with load_ranks)."""
    write_pickle(os.path.join(out, f"{name}-{rank}.pkl"), result)


def load_ranks(tmp_path, name, world):
    return [read_pickle(tmp_path / f"{name}-{r}.pkl") for r in range(world)]


def flat_params(module):
    """A module's parameters as one NumPy vector."""
    return torch.cat([p.detach().flatten() for p in module.parameters()]).numpy()


# ---- the reference: one process on the same global batches ----


def sum_of_squares(model):
    """The squared parameters, summed (the L2 term of a mean loss)."""
    return sum((p * p).sum() for p in model.parameters())


def native_expected(path="auto"):
    """Whether the DDP tests run lbbsp.torch's C++ step path: on PyTorch 2.x unless turned off (run_torch2_tests.sh
    builds it first, so a build that fails fails there, not here as a silent fall-back)."""
    return path != "0" and int(torch.__version__.split(".")[0]) >= 2


def one_process(steps, global_batch, seed=3, l2=0.0, mean=False, momentum=0.9, frozen=0):
    """One process on the same global batches: the summed loss / X, or (mean=True) the mean loss + l2 x the
    squared parameters; the first ``frozen`` layers not trained."""
    x, y = data()
    model = make_model()
    model[:frozen].requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    per_epoch = lbbsp.steps_per_epoch(N, global_batch)
    for g in range(steps):
        epoch, step = divmod(g, per_epoch)
        idx = torch.from_numpy(lbbsp.epoch_permutation(N, seed, epoch)[step * global_batch:(step + 1) * global_batch])
        if mean:
            loss = F.cross_entropy(model(x[idx]), y[idx]) + l2 * sum_of_squares(model)
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


# ---- the example trainers' data ----


def synth_images(path):
    """A small dataset in the Fashion-MNIST HDF5 layout (600 train images of 28 x 28, 10 classes)."""
    subprocess.run([os.environ.get("LBBSP_BIN", "lbbsp"), "data", "synth", "--samples", "600", "--features", "784",
                    "--classes", "10", "--seed", "1", "--out", str(path)], check=True, capture_output=True)


def shard(model, world, hsdp=False, mp_policy=None):
    """fully_shard on every Linear and on the root, as torchtitan shards its blocks; HSDP: 2 replicas (FSDP2:
    PyTorch >= 2.8, the FSDP test files skip before)."""
    from torch.distributed import fsdp
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard")) if hsdp else \
        init_device_mesh("cpu", (world,))
    kwargs = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            fsdp.fully_shard(m, **kwargs)
    return fsdp.fully_shard(model, **kwargs)


def full_params(model):
    """The sharded model's parameters, gathered, as one NumPy vector (a collective: every rank calls it)."""
    return torch.cat([p.full_tensor().detach().flatten() for p in model.parameters()]).numpy()


def fsdp2_or_skip():
    """torch.distributed.fsdp with FSDP2's custom collectives, else the calling test module is skipped."""
    if not TORCH2:  # importing torch.distributed.fsdp fails on 1.13 under Python 3.11 (a dataclass default)
        pytest.skip("FSDP2 is PyTorch 2.x (python.torch2)", allow_module_level=True)
    fsdp = pytest.importorskip("torch.distributed.fsdp")
    if not hasattr(fsdp, "fully_shard") or not hasattr(fsdp.FSDPModule, "set_custom_reduce_scatter"):
        pytest.skip("FSDP2 with custom collectives is PyTorch >= 2.8 (python.torch2)", allow_module_level=True)
    return fsdp
