"""lbbsp.lightning.LoadBalancedModelParallel: Lightning's ModelParallelStrategy with the LightningModule's
configure_model applying fully_shard (FSDP2) per layer and at the root, 3 CPU processes over gloo, float64: a random
balancer that gives zero-size slices, with accumulate_grad_batches=2, equals one process on the same global
batches; a distributed checkpoint taken mid-epoch resumes with the same sizes and parameters; refused
configurations raise. Runs where lightning is installed (python.torch2's venv).

ModelParallelStrategy starts its ranks only with Lightning's script launcher (popen): the tests run this file as a
script, whose ranks 1 and 2 Lightning starts again as new processes of the same file (PYTHONPATH passed on). One
script run does the three fits (full, stopped at step 13 with a checkpoint, resumed), for both tests."""

import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch", reason="lightning is not installed (python.torch2 installs it)")
fsdp = pytest.importorskip("torch.distributed.fsdp", reason="FSDP2 is PyTorch 2.x (python.torch2)")
if not hasattr(fsdp, "fully_shard") or not hasattr(fsdp.FSDPModule, "set_custom_reduce_scatter"):
    pytest.skip("FSDP2 with custom collectives is PyTorch >= 2.8 (python.torch2)", allow_module_level=True)

from harness import (  # noqa: E402
    assert_random5_equals_one_process,
    data,
    dump_rank,
    finish,
    fixed_metrics,
    free_port,
    init,
    make_model,
    one_process,
    read_pickle,
    spawn,
    write_pickle,
)

from lbbsp.lightning import LoadBalancedModelParallel, _sharded_root  # noqa: E402


class ShardedNet(pl.LightningModule):
    """harness's model (Linear, Tanh, Linear, float64), fully_shard on each Linear and on the Sequential; a
    DataLoader of 4 per rank under accumulate_grad_batches=2: global batch 3 x 4 x 2 = 24."""

    def __init__(self, out, tag):
        super().__init__()
        self.net, self.out, self.tag, self.sizes, self.micro = make_model(), out, tag, [], []

    def configure_model(self):
        mesh = self.device_mesh["data_parallel"]
        for m in self.net:
            if isinstance(m, torch.nn.Linear):
                fsdp.fully_shard(m, mesh=mesh)
        fsdp.fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.micro.append(len(y))
        return F.cross_entropy(self.net(x), y)  # the usual mean loss

    def on_train_batch_start(self, batch, batch_idx):
        self.sizes.append(self.trainer.strategy.load_balancer.batch_sizes.tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self):
        x, y = data()
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4, shuffle=True)

    def on_train_end(self):
        assert next(self.net.parameters()).dtype == torch.float64
        rank = self.trainer.global_rank
        sharded = all(isinstance(p, torch.distributed.tensor.DTensor) for p in self.net.parameters())
        params = torch.cat([p.full_tensor().detach().flatten() for p in self.net.parameters()]).numpy()  # all ranks
        logged = sorted(k for k in self.trainer.callback_metrics if k.startswith("lbbsp/"))
        write_pickle(os.path.join(self.out, f"{self.tag}-{rank}.pkl"),
                     {"params": params, "sizes": self.sizes[::2], "micro": self.micro, "logged": logged,
                      "sharded": sharded})


def _fit(out, tag, ckpt_path=None, **trainer_kwargs):
    strategy = LoadBalancedModelParallel(balancer="random:5", seed=3, monitor=fixed_metrics)
    # precision="32-true" (ModelParallelStrategy refuses "64-true") leaves the float64 model and data as they are
    kwargs = dict(accelerator="cpu", devices=3, strategy=strategy, max_epochs=2, precision="32-true",
                  accumulate_grad_batches=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, num_sanity_val_steps=0)
    kwargs.update(trainer_kwargs)
    pl.Trainer(**kwargs).fit(ShardedNet(out, tag), ckpt_path=ckpt_path)


def _script(out):
    """The three fits, in every rank (Lightning's launcher runs this file again for ranks 1 and 2)."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    _fit(out, "full")
    saver = ModelCheckpoint(dirpath=out, filename="mid", every_n_train_steps=13, save_top_k=-1)
    _fit(out, "first", max_steps=13, callbacks=[saver], enable_checkpointing=True)
    _fit(out, "resumed", ckpt_path=os.path.join(out, "mid.ckpt"))


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    import subprocess
    out = tmp_path_factory.mktemp("lightning_fsdp")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                                        os.environ.get("PYTHONPATH", "")]))
    env["MASTER_PORT"] = str(free_port())  # below the ephemeral range (harness.free_port)
    run = subprocess.run([sys.executable, os.path.abspath(__file__), str(out)], cwd=out, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return out, run


def test_model_parallel_fsdp2_with_accumulation_equals_one_process(fits):
    out, _ = fits
    got = [read_pickle(out / f"full-{r}.pkl") for r in range(3)]
    assert all(g["sharded"] for g in got), "configure_model's fully_shard left a parameter unsharded"
    sizes = np.array(got[0]["sizes"])
    micro = np.array([g["micro"] for g in got])
    assert micro.shape == (3, 40), micro.shape  # 20 steps x 2 micro-batches
    assert (micro[:, ::2] + micro[:, 1::2] == sizes.T).all(), (micro, sizes)
    assert "lbbsp/batch_size" in got[0]["logged"], got[0]["logged"]
    assert_random5_equals_one_process(got, sizes)


def test_model_parallel_distributed_checkpoint_resumes_with_the_same_sizes(fits):
    out, _ = fits
    full = read_pickle(out / "full-0.pkl")["sizes"]
    first = read_pickle(out / "first-0.pkl")["sizes"]
    assert first == full[:13], (first, full[:13])
    assert (out / "mid.ckpt").is_dir(), "ModelParallelStrategy wrote no distributed checkpoint"
    resumed = [read_pickle(out / f"resumed-{r}.pkl") for r in range(3)]
    assert resumed[0]["sizes"] == full[13:], (resumed[0]["sizes"], full[13:])
    ref = one_process(20, 24, mean=True)
    for r, g in enumerate(resumed):
        rel = np.linalg.norm(g["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r} after the resume: relative difference {rel:.3g} from one process"


def test_model_parallel_refuses_tensor_parallelism():
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1, got 2"):
        LoadBalancedModelParallel(tensor_parallel_size=2)


def _roots_worker(rank, world, store, out):
    """What the strategy builds its LoadBalancer on, for modules sharded three ways (1 rank: no launch needed)."""
    from torch.distributed.device_mesh import init_device_mesh
    init(rank, world, store)
    mesh = init_device_mesh("cpu", (world,))
    errors = {}
    two = torch.nn.ModuleDict({"a": make_model(), "b": make_model()})  # two roots side by side
    fsdp.fully_shard(two["a"], mesh=mesh)
    fsdp.fully_shard(two["b"], mesh=mesh)
    outside = torch.nn.Module()  # a trainable parameter beside the sharded root
    outside.net, outside.bias = fsdp.fully_shard(make_model(), mesh=mesh), torch.nn.Parameter(torch.zeros(3))
    good = torch.nn.Module()
    good.net = fsdp.fully_shard(make_model(), mesh=mesh)
    for name, module in [("none", torch.nn.Sequential(make_model())), ("two", two), ("outside", outside)]:
        try:
            _sharded_root(module, "Strategy")
        except TypeError as e:
            errors[name] = str(e)
    dump_rank(out, "roots", rank, {"errors": errors, "good": _sharded_root(good, "Strategy") is good.net})
    finish()


def test_the_sharded_root_is_found_or_what_is_missing_named(tmp_path):
    spawn(_roots_worker, 1, tmp_path)
    got = read_pickle(tmp_path / "roots-0.pkl")
    assert got["good"], "the one fully_shard root holding every parameter was not the one chosen"
    errors = got["errors"]
    assert "no fully_shard module in Sequential: apply torch.distributed.fsdp.fully_shard" in errors["none"], errors
    assert "2 separate fully_shard roots (a, b)" in errors["two"], errors
    assert "parameters outside the fully_shard root 'net': bias" in errors["outside"], errors


if __name__ == "__main__":
    _script(sys.argv[1])
