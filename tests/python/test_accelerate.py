"""lbbsp.accelerate on Hugging Face Accelerate (its Python launcher, 3 CPU processes, gloo): float64 training with a
random balancer that gives zero-size slices equals one process on the same global batches; save_state/load_state
continue with the same sizes. Runs where accelerate is installed (python.torch2's venv)."""

import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed (python.torch2 installs it)")

from harness import (  # noqa: E402
    assert_random5_equals_one_process,
    data,
    fixed_metrics,
    free_port,
    make_model,
    one_process,
    read_pickle,
    source_dir,
    synth_images,
    write_pickle,
)

import lbbsp.accelerate  # noqa: E402


class Recorder:
    """An Accelerate tracker that keeps what accelerator.log sends it (in a file per rank)."""

    def __new__(cls, out):
        class _Recorder(accelerate.tracking.GeneralTracker):
            name, requires_logging_directory, main_process_only = "recorder", False, False

            def __init__(self):
                super().__init__()
                self.out, self.logged = out, []

            @property
            def tracker(self):
                return self

            def store_init_configuration(self, values):
                pass

            def log(self, values, step=None, **kwargs):
                self.logged.append((step, dict(values)))
        return _Recorder()


def _prepared(acc, batch_size):
    """The test model, SGD and a shuffled DataLoader of the test data through lbbsp.accelerate.prepare with
    random:5: (model, optimizer, loader, LoadBalancer)."""
    net = make_model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size, shuffle=True)
    return lbbsp.accelerate.prepare(acc, net, opt, loader, balancer="random:5", seed=3, monitor=fixed_metrics)


def _worker(out, stop, resume):
    """gradient_accumulation_steps=2 with a DataLoader of 4 per rank: global batch 3 x 4 x 2 = 24 on 3 ranks."""
    recorder = Recorder(out)
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2, log_with=[recorder])
    acc.init_trackers("lbbsp")
    model, opt, loader, lb = _prepared(acc, batch_size=4)
    if resume:
        acc.load_state(os.path.join(out, "state"))
    sizes, micro = [], []
    for _epoch in range(lb.epoch, 2):
        for xb, yb in loader:
            with acc.accumulate(model):
                if len(micro) % 2 == 0:
                    sizes.append(lb.batch_sizes.tolist())
                micro.append(len(yb))
                acc.backward(F.cross_entropy(model(xb), yb))  # the usual mean loss
                opt.step()
                opt.zero_grad()
            if lb.global_step == stop:
                break
        if lb.global_step == stop:
            break
    if stop > 0:
        acc.save_state(os.path.join(out, "state"))
    rank = acc.process_index
    params = torch.cat([p.detach().flatten() for p in model.module.parameters()]).numpy()
    write_pickle(os.path.join(out, f"acc-{rank}-{int(resume)}.pkl"),
                 {"params": params, "sizes": sizes, "micro": micro, "logged": recorder.logged})
    acc.wait_for_everyone()


def _hang_worker(out):
    """Rank 2 hangs before its backward at step 3; the process group times out after 8 s."""
    import datetime
    import threading
    kw = accelerate.utils.InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=8))
    acc = accelerate.Accelerator(cpu=True, kwargs_handlers=[kw])
    net = make_model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model, opt, loader, lb = lbbsp.accelerate.prepare(acc, net, opt, loader, balancer="lbbsp-cpu",
                                                      predictor="ema", monitor=fixed_metrics)
    for xb, yb in loader:
        if acc.process_index == 2 and lb.global_step == 3:
            threading.Event().wait()  # never returns: torchrun ends this process
        acc.backward(F.cross_entropy(model(xb), yb))
        opt.step()
        opt.zero_grad()
    os._exit(0)


def _bf16_worker(out):
    """A float32 model on a learnable target under mixed_precision="bf16" (autocast on the CPU)."""
    acc = accelerate.Accelerator(cpu=True, mixed_precision="bf16")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x = data()[0].float()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :4].argmax(1)), batch_size=8)
    model, opt, loader, lb = lbbsp.accelerate.prepare(acc, net, opt, loader, balancer="random:5", seed=3,
                                                      monitor=fixed_metrics)
    sizes, losses, dtypes = [], [], set()
    net[0].register_forward_hook(lambda m, i, o: dtypes.add(str(o.dtype)))  # Accelerate returns outputs in fp32
    for _epoch in range(3):
        for xb, yb in loader:
            sizes.append(lb.batch_sizes.tolist())
            loss = F.cross_entropy(model(xb), yb)
            losses.append(float(loss))
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
    write_pickle(os.path.join(out, f"bf16-{acc.process_index}.pkl"),
                 {"sizes": sizes, "losses": losses, "dtypes": dtypes})
    acc.wait_for_everyone()


def _compile_worker(out):
    """Accelerator(dynamo_backend=...): prepare() hands back the compiled DDP model; mean loss, random:5."""
    acc = accelerate.Accelerator(cpu=True, dynamo_backend="aot_eager")
    model, opt, loader, lb = _prepared(acc, batch_size=8)
    sizes = []
    for _epoch in range(2):
        for xb, yb in loader:
            sizes.append(lb.batch_sizes.tolist())
            acc.backward(F.cross_entropy(model(xb), yb))
            opt.step()
            opt.zero_grad()
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    frames = torch._dynamo.utils.counters["frames"]["ok"]  # 0: it ran eagerly
    write_pickle(os.path.join(out, f"compile-{acc.process_index}.pkl"),
                 {"params": params, "sizes": sizes, "frames": frames, "model": type(model).__name__,
                  "reduction": lb.loss.reduction})
    acc.wait_for_everyone()


def _fsdp_worker(out):
    """A model sharded with fully_shard (each Linear and the root) before prepare, the Accelerator given an FSDP2
    plugin as on GPUs (Accelerate 1.15 drops it on CPUs: see test_accelerate_fully_sharded_model...);
    gradient_accumulation_steps=2 with a DataLoader of 4 per rank: global batch 3 x 4 x 2 = 24 on 3 ranks."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    recorder = Recorder(out)
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2, log_with=[recorder],
                                 fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    acc.init_trackers("lbbsp")
    mesh = init_device_mesh("cpu", (acc.num_processes,))  # over the process group Accelerator() made
    net = make_model()
    for m in net:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=True)
    model, opt, loader, lb = lbbsp.accelerate.prepare(acc, net, opt, loader, balancer="random:5", seed=3,
                                                      monitor=fixed_metrics)
    sizes, micro = [], []
    for _epoch in range(2):
        for xb, yb in loader:
            with acc.accumulate(model):
                if len(micro) % 2 == 0:
                    sizes.append(lb.batch_sizes.tolist())
                micro.append(len(yb))
                acc.backward(F.cross_entropy(model(xb), yb))  # the usual mean loss
                opt.step()
                opt.zero_grad()
    params = torch.cat([p.full_tensor().detach().flatten() for p in model.parameters()]).numpy()  # every rank
    try:
        acc.save_state(os.path.join(out, "state"))
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    write_pickle(os.path.join(out, f"fsdp-{acc.process_index}.pkl"),
                 {"params": params, "sizes": sizes, "micro": micro, "logged": recorder.logged,
                  "model": type(model).__name__, "refused": refused})
    acc.wait_for_everyone()


def _run(*args, cli=False, hostfile=None, processes=3):
    """3 CPU processes from a fresh interpreter (forked from pytest's process the workers hang): Accelerate's
    Python launcher; with cli=True torchrun (how Accelerate runs several CPU processes without MPI; unlike the
    Python launcher it lets the Accelerator make the process group, so its InitProcessGroupKwargs apply); with a
    hostfile `accelerate launch --cpu --num_processes P --mpirun_hostfile HOSTFILE` (Open MPI's mpirun)."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, __file__]
    if cli or hostfile:
        port = free_port()
    if cli:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3", "--master_port", str(port),
               __file__]
    elif hostfile:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--cpu", "--num_processes",
               str(processes), "--mpirun_hostfile", str(hostfile), "--main_process_port", str(port), __file__]
    return subprocess.run(cmd + list(map(str, args)), env=env, capture_output=True, text=True, timeout=500)


def _launch(out, stop=-1, resume=False):
    run = _run("exact", out, stop, int(resume))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [read_pickle(out / f"acc-{r}-{int(resume)}.pkl") for r in range(3)]


def test_accelerate_with_gradient_accumulation_equals_one_process_and_resumes(tmp_path):
    (tmp_path / "full").mkdir()
    full = _launch(tmp_path / "full")
    sizes = np.array(full[0]["sizes"])
    assert sizes.shape == (20, 3) and (sizes.sum(axis=1) == 24).all(), sizes
    micro = np.array([g["micro"] for g in full])
    assert micro.shape == (3, 40) and (micro[:, ::2] + micro[:, 1::2] == sizes.T).all(), micro
    logged = full[0]["logged"]  # accelerator.log runs on the main process
    assert [step for step, _ in logged] == list(range(1, 21)), logged
    assert all(v["lbbsp/batch_size"] == sizes[k, 0] for k, (_, v) in enumerate(logged)), (logged, sizes[:, 0])
    assert {"lbbsp/wait_s", "lbbsp/step_s"} <= set(logged[-1][1]), logged[-1]
    assert_random5_equals_one_process(full, sizes)
    ref = one_process(20, 24, mean=True)
    first = _launch(tmp_path, stop=13)
    assert first[0]["sizes"] == full[0]["sizes"][:13]
    resumed = _launch(tmp_path, resume=True)
    assert resumed[0]["sizes"] == full[0]["sizes"][13:], (resumed[0]["sizes"], full[0]["sizes"][13:])
    for r, g in enumerate(resumed):
        rel = np.linalg.norm(g["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r} after the resume: relative difference {rel:.3g} from one process"


def test_accelerate_launch_over_mpi_equals_one_process(tmp_path):
    """What a user types: `accelerate launch --cpu --num_processes N --mpirun_hostfile FILE train.py`. Two processes:
    Accelerate 1.15 always adds `--bind-to socket`, which Open MPI refuses for more processes than cores."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    run = _run("exact", tmp_path, -1, 0, hostfile=hosts, processes=2)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = [read_pickle(tmp_path / f"acc-{r}-0.pkl") for r in range(2)]
    assert_random5_equals_one_process(got, np.array(got[0]["sizes"]), world=2, global_batch=16)


def test_one_process_under_accelerate_launch_says_how_to_start_several(monkeypatch):
    """`accelerate launch --cpu --num_processes 3` without a host file starts the script once: say so."""
    import torch.distributed as dist
    assert not dist.is_initialized()
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # what accelerate launch's CPU launcher sets
    net = make_model()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=4)
    with pytest.raises(RuntimeError, match=r"started this script as one process.*--mpirun_hostfile.*torchrun"):
        lbbsp.accelerate.prepare(object(), net, torch.optim.SGD(net.parameters(), lr=0.1), loader)


def test_accelerate_hung_rank_ends_the_job_naming_it(tmp_path):
    run = _run("hang", tmp_path, cli=True)
    assert run.returncode != 0, run.stdout[-2000:]
    assert "LoadBalancer: step 3: the gradient allreduce failed" in run.stderr, run.stderr[-4000:]
    assert "not answering: rank 2 (" in run.stderr, run.stderr[-4000:]


def test_accelerate_bf16_agrees_on_every_rank_and_learns(tmp_path):
    run = _run("bf16", tmp_path, cli=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = [read_pickle(tmp_path / f"bf16-{r}.pkl") for r in range(3)]
    assert all(g["dtypes"] == {"torch.bfloat16"} for g in got), [g["dtypes"] for g in got]  # under autocast
    assert all(len(g["sizes"]) == 30 and g["sizes"] == got[0]["sizes"] for g in got), "the ranks' sizes differ"
    losses = [np.nanmean([g["losses"][i] for g in got]) for i in range(30)]  # a 0-sample rank's mean is NaN
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if "LOCAL_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:  # torchrun or mpirun: one rank
        if mode == "exact":
            _worker(args[0], int(args[1]), bool(int(args[2])))
        else:
            {"hang": _hang_worker, "bf16": _bf16_worker, "compile": _compile_worker}[mode](args[0])
    elif mode == "exact":
        accelerate.debug_launcher(_worker, args=(args[0], int(args[1]), bool(int(args[2]))), num_processes=3)
    else:
        accelerate.debug_launcher({"hang": _hang_worker, "bf16": _bf16_worker, "fsdp": _fsdp_worker}[mode],
                                  args=(args[0],), num_processes=3)


def test_accelerate_compiled_model_equals_one_process(tmp_path):
    """dynamo_backend= in the Accelerator: prepare() returns the compiled DDP model and balances it as the plain
    one, every rank equal to one process."""
    run = _run("compile", tmp_path, cli=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = [read_pickle(tmp_path / f"compile-{r}.pkl") for r in range(3)]
    assert all(g["frames"] > 0 and g["model"] == "OptimizedModule" for g in got), \
        [(g["frames"], g["model"]) for g in got]
    # no accumulation, DDP: the hook weights the mean loss (loss_reduction "auto"), no lb.scale a step
    assert all(g["reduction"] == "auto" for g in got), [g["reduction"] for g in got]
    assert_random5_equals_one_process(got, np.array(got[0]["sizes"]))


def test_example_runs_and_the_slowed_rank_gets_fewer_samples(tmp_path):
    """20 ms a sample on rank 1: the sleep outweighs rank 0's step even with the cores shared (under a loaded
    CI, other tests' ranks beside it, rank 0's 50-60 samples measured 20-230 ms a step; at 3 ms a sample the
    split once stayed at 34/26)."""
    import re
    import subprocess
    src = source_dir()
    data_file = tmp_path / "synth.h5"
    synth_images(data_file)
    run = subprocess.run([sys.executable, os.path.join(src, "examples", "accelerate_fmnist.py"), "--data",
                          str(data_file), "--devices", "2", "--epochs", "2", "--batch-size", "30", "--slow",
                          "1:0.02"], capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    last = re.findall(r"epoch 1: test accuracy [0-9.]+, batch sizes \[(\d+), (\d+)\]", run.stdout)
    assert last, run.stdout
    fast, slow = map(int, last[-1])
    assert fast + slow == 60 and slow < 0.5 * fast, last


def test_accelerate_fully_sharded_model_with_accumulation_equals_one_process(tmp_path):
    """FSDP2 on CPUs: Accelerate 1.15 applies FullyShardedDataParallelPlugin only to multi-GPU (and other
    accelerator) runs; on CPUs it drops it and wraps the model in DDP (accelerate/state.py, AcceleratorState:
    distributed_type becomes FSDP only from MULTI_GPU, MULTI_NPU, ...), and prepare_model refuses a model that holds
    DTensor parameters there ("... incompatible with DDP"). A model the user sharded before prepare is used as it
    is (not wrapped), its reduce-scatters skipped inside accumulate() before a step's last micro-batch: every rank
    equals one process. accelerator.save_state, which would save the main process's shards, says what to use."""
    fsdp = pytest.importorskip("torch.distributed.fsdp", reason="FSDP2 is PyTorch 2.x (python.torch2)")
    if not hasattr(fsdp, "FSDPModule") or not hasattr(fsdp.FSDPModule, "set_custom_reduce_scatter"):
        pytest.skip("FSDP2 with custom collectives is PyTorch >= 2.8 (python.torch2)")
    run = _run("fsdp", tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = [read_pickle(tmp_path / f"fsdp-{r}.pkl") for r in range(3)]
    assert all(g["model"].startswith("FSDP") for g in got), [g["model"] for g in got]  # not wrapped in DDP
    sizes = np.array(got[0]["sizes"])
    micro = np.array([g["micro"] for g in got])
    assert micro.shape == (3, 40) and (micro[:, ::2] + micro[:, 1::2] == sizes.T).all(), micro
    logged = got[0]["logged"]  # accelerator.log runs on the main process
    assert [step for step, _ in logged] == list(range(1, 21)), logged
    assert all(v["lbbsp/batch_size"] == sizes[k, 0] for k, (_, v) in enumerate(logged)), (logged, sizes[:, 0])
    assert_random5_equals_one_process(got, sizes)
    assert all("save the model, the optimizer and the balancer with torch.distributed.checkpoint" in g["refused"]
               for g in got), [g["refused"] for g in got]  # accelerator.save_state: not the main process's shards
