"""lbbsp.accelerate on Hugging Face Accelerate (its Python launcher, 3 CPU processes, gloo): float64 training with a
random balancer that gives zero-size slices equals one process on the same global batches; save_state/load_state
continue with the same sizes. Runs where accelerate is installed (python.torch2's venv)."""

import os
import pickle
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

accelerate = pytest.importorskip("accelerate", reason="accelerate is not installed (python.torch2 installs it)")

import lbbsp.accelerate  # noqa: E402
from test_torch import data, fixed_metrics, make_model, one_process, synth_images  # noqa: E402


def _worker(out, stop, resume):
    acc = accelerate.Accelerator(cpu=True)
    net = make_model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True)
    model, opt, loader, lb = lbbsp.accelerate.prepare(acc, net, opt, loader, balancer="random:5", seed=3,
                                                      monitor=fixed_metrics)
    if resume:
        acc.load_state(os.path.join(out, "state"))
    sizes = []
    for epoch in range(lb.epoch, 2):
        for xb, yb in loader:
            sizes.append(lb.batch_sizes.tolist())
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
    pickle.dump({"params": params, "sizes": sizes}, open(os.path.join(out, f"acc-{rank}-{int(resume)}.pkl"), "wb"))
    acc.wait_for_everyone()
    sys.stdout.flush()
    os._exit(0)  # no interpreter shutdown: PyTorch issue 117762 (see test_torch.finish)


def _launch(out, stop=-1, resume=False):
    """Accelerate's Python launcher (3 forked CPU processes), from a fresh interpreter: forked from pytest's
    process the workers hang."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, __file__, str(out), str(stop), str(int(resume))], env=env,
                         capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [pickle.load(open(out / f"acc-{r}-{int(resume)}.pkl", "rb")) for r in range(3)]


def test_accelerate_equals_one_process_and_resumes(tmp_path):
    (tmp_path / "full").mkdir()
    full = _launch(tmp_path / "full")
    sizes = np.array(full[0]["sizes"])
    assert sizes.shape == (20, 3) and (sizes.sum(axis=1) == 24).all(), sizes
    assert all(g["sizes"] == full[0]["sizes"] for g in full), "the ranks disagree on the sizes"
    assert (sizes == 0).any(), "random:5 gave no 0-sample rank: the test lost its point"
    ref = one_process(20, 24, mean=True)
    for r, g in enumerate(full):
        rel = np.linalg.norm(g["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r}: relative difference {rel:.3g} from one process"
    first = _launch(tmp_path, stop=13)
    assert first[0]["sizes"] == full[0]["sizes"][:13]
    resumed = _launch(tmp_path, resume=True)
    assert resumed[0]["sizes"] == full[0]["sizes"][13:], (resumed[0]["sizes"], full[0]["sizes"][13:])
    for r, g in enumerate(resumed):
        rel = np.linalg.norm(g["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r} after the resume: relative difference {rel:.3g} from one process"


if __name__ == "__main__":
    accelerate.debug_launcher(_worker, args=(sys.argv[1], int(sys.argv[2]), bool(int(sys.argv[3]))), num_processes=3)


def test_example_runs_and_the_slowed_rank_gets_fewer_samples(tmp_path):
    import re
    import subprocess
    src = os.environ.get("LBBSP_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
    data_file = tmp_path / "synth.h5"
    synth_images(data_file)
    run = subprocess.run([sys.executable, os.path.join(src, "examples", "accelerate_fmnist.py"), "--data",
                          str(data_file), "--devices", "2", "--epochs", "2", "--batch-size", "30", "--slow",
                          "1:0.003"], capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    last = re.findall(r"epoch 1: test accuracy [0-9.]+, batch sizes \[(\d+), (\d+)\]", run.stdout)
    assert last, run.stdout
    fast, slow = map(int, last[-1])
    assert fast + slow == 60 and slow < 0.5 * fast, last
