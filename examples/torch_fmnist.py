#!/usr/bin/env python3
"""A complete PyTorch DDP trainer balanced by lbbsp.torch: Fashion-MNIST from HDF5 read by DataLoader workers, the
usual mean loss through lb.scale, a validation pass per epoch, and checkpoints that resume mid-epoch, also at
another world size.

    lbbsp data import-fashion-mnist --out data/fmnist.h5
    python3 examples/torch_fmnist.py --data data/fmnist.h5 --spawn 4 --checkpoint /tmp/ck.pt --stop-after 100
    python3 examples/torch_fmnist.py --data data/fmnist.h5 --spawn 3 --checkpoint /tmp/ck.pt   # resumes there
    torchrun --nproc-per-node 4 examples/torch_fmnist.py --data data/fmnist.h5                  # or mpirun, srun

--slow RANK:SECONDS makes one rank's samples cost SECONDS more each to read (a straggler in data loading).
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from lbbsp.torch import LoadBalancer, init_from_env


class H5Images(torch.utils.data.Dataset):
    """Map-style: image i of one split of the HDF5 file (opened lazily, once per DataLoader worker)."""

    def __init__(self, path, split, delay_s=0.0):
        import h5py
        self.path, self.split, self.delay_s, self.file = path, split, delay_s, None
        with h5py.File(path, "r") as f:
            self.n = len(f[f"{split}/labels"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import h5py
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        if self.delay_s:
            time.sleep(self.delay_s)
        image = torch.from_numpy(self.file[f"{self.split}/images"][i]).float().div_(255.0).flatten()
        return image, int(self.file[f"{self.split}/labels"][i])


def validate(model, data, rank, world):
    """Accuracy on the test split: each rank counts an equal share (not balanced), summed over ranks."""
    share = torch.utils.data.Subset(data, range(rank, len(data), world))
    counts = torch.zeros(2, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(share, batch_size=256):
            counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    model.train()
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def train(a):
    rank, world = dist.get_rank(), dist.get_world_size()
    slow_rank, slow_s = (int(a.slow.split(":")[0]), float(a.slow.split(":")[1])) if a.slow else (-1, 0.0)
    data = H5Images(a.data, "train", slow_s if rank == slow_rank else 0.0)
    test = H5Images(a.data, "test")
    torch.manual_seed(a.seed)
    model = DDP(nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    # The DataLoader reads workers x prefetch_factor batches ahead: the balancer decides that far ahead.
    lb = LoadBalancer(model, dataset_size=len(data), global_batch=a.global_batch, balancer=a.balancer,
                      seed=a.seed)  # lag: set by data_loader() to what its workers read ahead
    if a.checkpoint and os.path.exists(a.checkpoint):
        state = torch.load(a.checkpoint)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        lb.load_state_dict(state["lb"])  # at any step; another world size starts the balancer afresh
        if rank == 0:
            print(f"resumed at step {lb.global_step} (epoch {lb.epoch}), saved by {state['world_size']} ranks, "
                  f"now {world}", flush=True)
    loader = lb.data_loader(data, num_workers=a.workers, prefetch_factor=1, persistent_workers=a.workers > 0)
    for epoch in range(lb.epoch, a.epochs):
        loader.batch_sampler.set_epoch(epoch)
        for x, y in loader:
            loss = lb.scale(F.cross_entropy(model(x), y))  # the mean over this rank's samples, scaled
            loss.backward()
            opt.step()
            opt.zero_grad()
            lb.step()
            if a.stop_after and lb.global_step == a.stop_after:
                return save(a, model, opt, lb, world)
        with lb.untimed():  # validation is not part of the next step's time
            accuracy = validate(model.module, test, rank, world)
            save(a, model, opt, lb, world)
        if rank == 0:
            print(f"epoch {epoch}: test accuracy {accuracy:.4f}, batch sizes {lb.batch_sizes.tolist()}", flush=True)


def save(a, model, opt, lb, world):
    """Rank 0 saves; the LoadBalancer's state is the same on every rank."""
    state = lb.state_dict()
    if a.checkpoint and dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "lb": state,
                    "world_size": world}, a.checkpoint + ".tmp")
        os.replace(a.checkpoint + ".tmp", a.checkpoint)
        print(f"checkpoint at step {lb.global_step}: {a.checkpoint}", flush=True)


def spawned(rank, a, world, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    init_from_env(backend="gloo")
    torch.set_num_threads(1)
    train(a)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="Fashion-MNIST HDF5 (lbbsp data import-fashion-mnist)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--balancer", default="lbbsp-cpu")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    ap.add_argument("--checkpoint", default=None, help="file to save every epoch and resume from if present")
    ap.add_argument("--stop-after", type=int, default=0, help="save and stop after this global step")
    ap.add_argument("--slow", default="", help="RANK:SECONDS extra read time per sample on one rank")
    ap.add_argument("--spawn", type=int, default=0, help="start N local processes instead of using a launcher")
    a = ap.parse_args()
    if not os.path.exists(a.data):
        ap.error(f"--data {a.data} does not exist (make it with: lbbsp data import-fashion-mnist --out {a.data})")
    if a.slow and (a.slow.count(":") != 1 or not a.slow.split(":")[0].isdigit()):
        ap.error(f"--slow must be RANK:SECONDS, got {a.slow!r}")
    if a.spawn:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(spawned, args=(a, a.spawn, port), nprocs=a.spawn, join=True)
        return
    init_from_env()
    train(a)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
