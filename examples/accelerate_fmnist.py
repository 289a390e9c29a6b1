#!/usr/bin/env python3
"""Hugging Face Accelerate on Fashion-MNIST, balanced by lbbsp: the loop is plain Accelerate; the one change is
lbbsp.accelerate.prepare in place of accelerator.prepare for the training triple.

    lbbsp data import-fashion-mnist --out data/fmnist.h5
    torchrun --nproc_per_node 4 examples/accelerate_fmnist.py --data data/fmnist.h5 --slow 3:0.001
    accelerate launch --cpu --num_processes 4 --mpirun_hostfile hosts \
        examples/accelerate_fmnist.py --data data/fmnist.h5
    python3 examples/accelerate_fmnist.py --data data/fmnist.h5 --devices 4     # accelerate.debug_launcher

--slow RANK:SECONDS makes one rank's step cost SECONDS more per sample (a straggler).
"""
import argparse
import time

import accelerate
import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import lbbsp.accelerate


def split(path, name):
    with h5py.File(path, "r") as f:
        x = torch.from_numpy(np.asarray(f[f"{name}/images"], dtype=np.float32).reshape(-1, 784) / 255.0)
        y = torch.from_numpy(np.asarray(f[f"{name}/labels"], dtype=np.int64))
    return torch.utils.data.TensorDataset(x, y)


def train(a):
    torch.set_num_threads(1)
    accelerator = accelerate.Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    loader = torch.utils.data.DataLoader(split(a.data, "train"), batch_size=a.batch_size, shuffle=True)
    model, optimizer, loader, lb = lbbsp.accelerate.prepare(accelerator, model, optimizer, loader,
                                                            balancer=a.balancer)
    test = split(a.data, "test")
    rank, seconds = (int(a.slow.split(":")[0]), float(a.slow.split(":")[1]))
    for epoch in range(lb.epoch, a.epochs):
        for x, y in loader:
            if accelerator.process_index == rank:
                time.sleep(seconds * len(y))
            loss = F.cross_entropy(model(x), y)  # the usual mean loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        with lb.untimed(), torch.no_grad():
            accuracy = (model.module(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean().item()
        accelerator.print(f"epoch {epoch}: test accuracy {accuracy:.4f}, batch sizes {lb.batch_sizes.tolist()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--devices", type=int, default=0, help="start N CPU processes (else: launched by accelerate)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank of the equal split")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--balancer", default="lbbsp-cpu")
    ap.add_argument("--slow", default="-1:0", help="RANK:SECONDS per sample added to one rank's step")
    a = ap.parse_args()
    if a.devices:
        accelerate.debug_launcher(train, args=(a,), num_processes=a.devices)
    else:
        train(a)


if __name__ == "__main__":
    main()
