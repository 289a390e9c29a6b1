#!/usr/bin/env python3
"""Writes tests/fixtures/models_pytorch_reference.json: loss, correct count and (a sample of) the summed
gradient of tiny logreg/MLP/CNN models, computed by PyTorch in float64 from parameters and inputs given by
closed formulas, so test_models_pytorch can recompute the same case with our kernels and compare.

Our layout differs from PyTorch's in two places, converted here: conv weights are [out, kh, kw, in] (PyTorch
[out, in, kh, kw]) and the CNN's fc input is flattened as (h, w, c) (PyTorch (c, h, w)).

usage: dev/peers/pytorch_reference.py [OUTPUT]   (run with a python3 that has torch, e.g. /usr/bin/python3)
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

GRAD_STRIDE = 5  # keep every 5th gradient entry: the fixture stays small (< 50 KB)
CASES = [
    {"kind": "logreg", "input": [1, 4, 5], "classes": 3, "hidden": [], "n": 3},
    {"kind": "mlp", "input": [1, 4, 5], "classes": 3, "hidden": [7, 5], "n": 3},
    {"kind": "cnn", "input": [2, 8, 4], "classes": 3, "hidden": [], "n": 3},
]


# The same formulas are in tests/unit/test_models_pytorch.cpp.
def param_value(i):
    return 0.2 * math.sin(0.7 * i + 0.1)


def input_value(i):
    return 0.5 + 0.5 * math.sin(0.1 * i + 0.3)


def label_value(s, classes):
    return (3 * s + 1) % classes


def build(case):
    """Returns (list of (name, our shape, to_torch, from_torch)), forward(params, x)."""
    c, h, w = case["input"]
    k = case["classes"]
    if case["kind"] in ("logreg", "mlp"):
        widths = case["hidden"] + [k]
        tensors, fan_in = [], c * h * w
        for layer, out in enumerate(widths):
            tensors.append((f"fc{layer + 1}.weight", [out, fan_in]))
            tensors.append((f"fc{layer + 1}.bias", [out]))
            fan_in = out

        def forward(p, x):
            a = x.reshape(x.shape[0], -1)
            for layer in range(len(widths)):
                a = F.linear(a, p[2 * layer], p[2 * layer + 1])
                if layer + 1 < len(widths):
                    a = F.relu(a)
            return a

        return tensors, [None] * len(tensors), forward
    # cnn
    h4, w4 = h // 4, w // 4
    tensors = [("conv1.weight", [16, 5, 5, c]), ("conv1.bias", [16]), ("conv2.weight", [32, 5, 5, 16]),
               ("conv2.bias", [32]), ("fc.weight", [k, h4, w4, 32]), ("fc.bias", [k])]
    # our layout -> PyTorch layout (permute the same way for gradients, then back)
    perms = [(0, 3, 1, 2), None, (0, 3, 1, 2), None, (0, 3, 1, 2), None]

    def forward(p, x):
        a = F.max_pool2d(F.relu(F.conv2d(x, p[0], p[1], padding=2)), 2)
        a = F.max_pool2d(F.relu(F.conv2d(a, p[2], p[3], padding=2)), 2)
        return F.linear(a.reshape(a.shape[0], -1), p[4].reshape(k, -1), p[5])

    return tensors, perms, forward


def run(case):
    c, h, w = case["input"]
    n, k = case["n"], case["classes"]
    tensors, perms, forward = build(case)
    flat, offset, params = [], 0, []
    for (_name, shape), perm in zip(tensors, perms):
        size = math.prod(shape)
        ours = torch.tensor([param_value(offset + i) for i in range(size)], dtype=torch.float64).reshape(shape)
        theirs = ours.permute(*perm).contiguous() if perm else ours.clone()
        theirs.requires_grad_(True)
        params.append(theirs)
        offset += size
    x = torch.tensor([input_value(i) for i in range(n * c * h * w)], dtype=torch.float64).reshape(n, c, h, w)
    y = torch.tensor([label_value(s, k) for s in range(n)])
    logits = forward(params, x)
    loss = F.cross_entropy(logits, y, reduction="sum")
    loss.backward()
    for p, perm in zip(params, perms):
        g = p.grad
        if perm:  # back to our layout: invert the permutation
            inverse = [perm.index(d) for d in range(len(perm))]
            g = g.permute(*inverse)
        flat.extend(g.contiguous().reshape(-1).tolist())
    return dict(case, num_params=offset, loss_sum=loss.item(), correct=int((logits.argmax(1) == y).sum()),
                grad_stride=GRAD_STRIDE, grad_sample=flat[::GRAD_STRIDE],
                grad_abs_sum=sum(abs(v) for v in flat))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/models_pytorch_reference.json"
    result = {"generator": "dev/peers/pytorch_reference.py", "torch": torch.__version__,
              "cases": [run(case) for case in CASES]}
    with open(out, "w") as f:
        json.dump(result, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
