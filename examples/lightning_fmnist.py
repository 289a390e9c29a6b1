#!/usr/bin/env python3
"""PyTorch Lightning on Fashion-MNIST, balanced by lbbsp: the LightningModule is plain Lightning; the one change is
the Trainer's strategy.

    lbbsp data import-fashion-mnist --out data/fmnist.h5
    python3 examples/lightning_fmnist.py --data data/fmnist.h5 --devices 4 --slow 3:0.001

--slow RANK:SECONDS makes one rank's training_step cost SECONDS more per sample (a straggler).
"""
import argparse
import time

import h5py
import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from lbbsp.lightning import LoadBalancedDDP


class FashionMLP(pl.LightningModule):
    def __init__(self, data, batch_size, lr, slow):
        super().__init__()
        self.data, self.batch_size, self.lr, self.slow = data, batch_size, lr, slow
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))

    def _split(self, name):
        with h5py.File(self.data, "r") as f:
            x = torch.from_numpy(np.asarray(f[f"{name}/images"], dtype=np.float32) / 255.0)
            y = torch.from_numpy(np.asarray(f[f"{name}/labels"], dtype=np.int64))
        return torch.utils.data.TensorDataset(x, y)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self._split("train"), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self._split("test"), batch_size=512)

    def training_step(self, batch, batch_idx):
        x, y = batch
        rank, seconds = self.slow
        if self.global_rank == rank:
            time.sleep(seconds * len(y))
        return F.cross_entropy(self.net(x), y)  # the usual mean loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_accuracy", (self.net(x).argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank of the equal split (global = x devices)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--balancer", default="lbbsp-cpu")
    ap.add_argument("--slow", default="-1:0", help="RANK:SECONDS per sample added to one rank's training_step")
    a = ap.parse_args()
    slow = (int(a.slow.split(":")[0]), float(a.slow.split(":")[1]))
    torch.set_num_threads(1)
    trainer = pl.Trainer(accelerator="cpu", devices=a.devices, max_epochs=a.epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         strategy=LoadBalancedDDP(balancer=a.balancer, start_method="spawn"))
    model = FashionMLP(a.data, a.batch_size, a.lr, slow)
    trainer.fit(model)
    print(f"val_accuracy {float(trainer.callback_metrics['val_accuracy']):.4f}", flush=True)


if __name__ == "__main__":
    main()
