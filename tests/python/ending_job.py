"""A short balanced training job, ended in one of the ways a user's script ends; test_endings.py starts it many
times and counts the exit codes (a job that trained exits 0, an exception exits 1, never a signal).

    ending_job.py forked JOBS WORLD ENDING FRAMEWORK DIR   JOBS jobs one after the other, each of WORLD ranks forked
                                                          from this process (imports done once); every rank ends
                                                          through the interpreter's own exit, as a script does;
                                                          prints one line per job: "exits: E0 E1 ..." (-6: SIGABRT)
    ending_job.py spawn|fork JOBS WORLD ENDING DIR        JOBS jobs one after the other, each started by
                                                          torch.multiprocessing.start_processes from this process;
                                                          prints "job: ok" or what the launcher raised, per job
    ending_job.py env ENDING                              one rank, under torchrun or mpirun (init_from_env)

ENDING (what the worker does after its last step):
    destroy_last       dist.destroy_process_group() as its last line, the LoadBalancer still referenced (PyTorch's
                       DDP tutorial's shape)
    drop_then_destroy  del lb; gc.collect(); dist.destroy_process_group()
    no_destroy         returns, destroy_process_group() never called
    global             the LoadBalancer kept in a module global: alive at interpreter exit, nothing destroyed
    exception          raises at the last step (the job must end with that exception and exit code 1)
FRAMEWORK: torch (a plain loop), lightning (Trainer.fit with LoadBalancedDDP), accelerate (lbbsp.accelerate.prepare).
"""

import faulthandler
import gc
import importlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

# An abort at exit prints every Python thread's stack (into the rank's log): which step of the interpreter's exit
# it met, for the failure message of test_endings.py.
faulthandler.enable(all_threads=True)
STEPS, GLOBAL_BATCH, N, DIM = 6, 32, 512, 16
KEPT = []  # the "global" ending's LoadBalancers: alive until the interpreter exits


class UserError(RuntimeError):
    pass


def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, DIM, generator=g), torch.randint(0, 4, (N,), generator=g)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def end(ending, held):
    """``held``: a list holding the job's only reference to its LoadBalancer (the caller deleted its own name), so
    that drop_then_destroy really drops it before destroying the process group."""
    if ending == "global":
        KEPT.append(held.pop())
    elif ending == "drop_then_destroy":
        held.clear()
        gc.collect()
        dist.destroy_process_group()
    elif ending == "destroy_last":
        dist.destroy_process_group()


def torch_worker(ending):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lbbsp.torch import LoadBalancer
    x, y = data()
    ddp = DDP(model())
    lb = LoadBalancer(ddp, dataset_size=N, global_batch=GLOBAL_BATCH, predictor="narx")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(STEPS):
        idx = torch.from_numpy(lb.indices(lb.epoch, lb.global_step % lb.steps_per_epoch))
        loss = lb.scale(F.cross_entropy(ddp(x[idx]), y[idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        lb.step()
        if ending == "exception" and step == STEPS - 1:
            raise UserError("the user's error at the last step")
    held = [lb]
    del lb
    end(ending, held)


def lightning_worker(ending, world):
    import lightning.pytorch as pl

    from lbbsp.lightning import LoadBalancedDDP

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model()

        def training_step(self, batch, batch_idx):
            if ending == "exception" and self.global_step == STEPS - 1:
                raise UserError("the user's error at the last step")
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()),
                                               batch_size=GLOBAL_BATCH // world)

    strategy = LoadBalancedDDP(balancer="lbbsp-cpu")
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=STEPS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(Net())
    end(ending, [strategy.load_balancer])  # the strategy keeps its own reference


def accelerate_worker(ending, world):
    import accelerate

    import lbbsp.accelerate
    accelerator = accelerate.Accelerator(cpu=True)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data()), batch_size=GLOBAL_BATCH // world)
    net, opt, loader, lb = lbbsp.accelerate.prepare(accelerator, net, opt, loader)
    for step, (x, y) in enumerate(loader):
        accelerator.backward(F.cross_entropy(net(x), y))
        opt.step()
        opt.zero_grad()
        if ending == "exception" and step == STEPS - 1:
            raise UserError("the user's error at the last step")
        if step == STEPS - 1:
            break
    held = [lb]
    del lb
    end(ending, held)


def run_rank(ending, framework, world):
    """One rank of a job whose process group comes from the environment (RANK, WORLD_SIZE, MASTER_*)."""
    torch.set_num_threads(1)
    if framework == "torch":
        from lbbsp.torch import init_from_env
        init_from_env("gloo")
        torch_worker(ending)
    elif framework == "lightning":
        lightning_worker(ending, world)
    else:
        from lbbsp.torch import init_from_env
        init_from_env("gloo")
        accelerate_worker(ending, world)


def mp_worker(rank, world, store, ending):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch_worker(ending)


def forked(jobs, world, ending, framework, folder):
    """JOBS jobs of WORLD forked ranks. A rank leaves this function only by raising SystemExit (or the job's
    exception), so that it ends as a script does: atexit handlers, then the interpreter's shutdown."""
    from harness import free_port  # the tests' helper (tests/python on PYTHONPATH): the other modes never load it
    preload(framework)
    for job in range(jobs):
        port, pids = free_port(), []
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                log = os.open(os.path.join(folder, f"{framework}-{ending}-{job}-{rank}.log"),
                              os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world),
                                  LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                run_rank(ending, framework, world)
                sys.exit(0)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        print("exits:", *codes, flush=True)


def launched(method, jobs, world, ending, folder):
    """JOBS jobs of torch.multiprocessing.start_processes, as PyTorch's DDP tutorial starts one."""
    import torch.multiprocessing as mp
    for job in range(jobs):
        store = os.path.join(folder, f"store-{job}")
        try:
            mp.start_processes(mp_worker, args=(world, store, ending), nprocs=world, start_method=method)
            print("job: ok", flush=True)
        except mp.ProcessExitedException as e:  # a rank killed by a signal, or exiting non-zero
            print(f"job: {e}", flush=True)


def preload(framework):
    """Imports done once in the parent, before any thread starts (DDP's constructor imports torch._dynamo on 2.x)."""
    import lbbsp.torch
    if int(torch.__version__.split(".")[0]) >= 2:
        importlib.import_module("torch._dynamo")
    if framework == "lightning":
        import lbbsp.lightning
    elif framework == "accelerate":
        import lbbsp.accelerate  # noqa: F401


def main(argv):
    mode = argv[0]
    if mode == "forked":
        forked(int(argv[1]), int(argv[2]), argv[3], argv[4], argv[5])
    elif mode in ("spawn", "fork"):
        launched(mode, int(argv[1]), int(argv[2]), argv[3], argv[4])
    elif mode == "env":
        run_rank(argv[1], "torch", int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))))
    else:
        raise SystemExit(f"ending_job.py: unknown mode {mode!r} (forked, spawn, fork, env)")


if __name__ == "__main__":
    main(sys.argv[1:])
