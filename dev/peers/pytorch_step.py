#!/usr/bin/env python3
"""PyTorch peer of bench_models' train_step: the same three models (logreg, MLP 784-256-128-10, CNN
conv5x5(16)-ReLU-pool2, conv5x5(32)-ReLU-pool2, fc 1568-10) on random 1x28x28 inputs, timing N train steps
(forward, cross-entropy with reduction='sum', backward, SGD with momentum 0.9 and weight decay 5e-4).

Prints one JSON object per line: {"model", "batch", "threads", "steps", "samples_per_s", "cpu_samples_per_s",
"torch"}. samples_per_s uses wall time; cpu_samples_per_s uses this process's CPU time (all threads), the fairer
number on a shared machine when threads == 1.
"""
import argparse
import json
import time

import torch
import torch.nn as nn


def make_model(kind: str) -> nn.Module:
    if kind == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(1568, 10))
    raise ValueError(f"unknown model {kind!r} (expected logreg, mlp or cnn)")


def time_steps(kind: str, batch: int, min_seconds: float, warmup: int) -> dict:
    torch.manual_seed(0)
    model = make_model(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 / batch, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    x = torch.rand(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    steps = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while True:
        step()
        steps += 1
        wall = time.perf_counter() - wall0
        if wall >= min_seconds and steps >= 3:
            break
    cpu = time.process_time() - cpu0
    return {"model": kind, "batch": batch, "threads": torch.get_num_threads(), "steps": steps,
            "samples_per_s": steps * batch / wall, "cpu_samples_per_s": steps * batch / cpu,
            "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="logreg,mlp,cnn")
    parser.add_argument("--batches", default="32,64,256")
    parser.add_argument("--min-seconds", type=float, default=1.0, help="time per (model, batch), at least 3 steps")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for kind in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            print(json.dumps(time_steps(kind, batch, args.min_seconds, args.warmup)), flush=True)


if __name__ == "__main__":
    main()
