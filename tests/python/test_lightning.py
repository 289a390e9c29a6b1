"""lbbsp.lightning on Lightning 2.x (its own launcher, 3 CPU processes, gloo): float64 training with a random
balancer that gives zero-size slices equals one process on the same global batches; the balancer's figures are
logged; refused configurations raise. Runs where lightning is installed (python.torch2's venv).

The trainers here start their ranks with start_method="fork" (Lightning's ddp_fork): forked ranks inherit this
process's imports (torch, lightning, torch._dynamo, ~6 s of CPU per spawned rank); spawned where torch sees a GPU
(harness.resolved_start_method). test_example_runs and the script launcher's test start them as users do."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pl = pytest.importorskip("lightning.pytorch", reason="lightning is not installed (python.torch2 installs it)")

from harness import (  # noqa: E402
    CLASSES,
    assert_random5_equals_one_process,
    data,
    fixed_metrics,
    free_port,
    make_model,
    one_process,
    read_pickle,
    resolved_start_method,
    source_dir,
    synth_images,
    write_pickle,
)

from lbbsp.lightning import LoadBalancedDDP  # noqa: E402


@pytest.fixture(autouse=True)
def _own_master_port():
    """Each test its own free port, below the ephemeral range (harness.free_port; Lightning's own pick is a port
    the kernel handed out, which another worker's gloo socket may take before rank 0 binds it). Lightning's launcher
    keeps MASTER_PORT in this process's environment: dropped after the test, so the next one picks afresh."""
    os.environ["MASTER_PORT"] = str(free_port())
    yield
    os.environ.pop("MASTER_PORT", None)


class Net(pl.LightningModule):
    batch_size = 8

    def __init__(self, out):
        super().__init__()
        self.net, self.out, self.sizes = make_model(), out, []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)  # the usual mean loss

    def on_train_batch_start(self, batch, batch_idx):
        self.sizes.append(self.trainer.strategy.load_balancer.batch_sizes.tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self):
        x, y = data()
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=self.batch_size,
                                           shuffle=True)

    def on_train_end(self):
        rank = self.trainer.global_rank
        params = torch.cat([p.detach().flatten() for p in self.net.parameters()]).numpy()
        logged = sorted(k for k in self.trainer.callback_metrics if k.startswith("lbbsp/"))
        reduction = self.trainer.strategy.load_balancer.loss.reduction  # "auto": the hook weights the loss
        write_pickle(os.path.join(self.out, f"lightning-{rank}.pkl"),
                     {"params": params, "sizes": self.sizes, "logged": logged, "reduction": reduction})


class MicroNet(Net):
    """Net with a DataLoader of 4 per rank under accumulate_grad_batches=2: global batch 3 x 4 x 2 = 24; each
    rank's slice of a step comes as 2 micro-batches."""
    batch_size = 4

    def training_step(self, batch, batch_idx):
        self.micro = getattr(self, "micro", []) + [len(batch[1])]
        return super().training_step(batch, batch_idx)

    def on_train_end(self):
        super().on_train_end()
        write_pickle(os.path.join(self.out, f"micro-{self.trainer.global_rank}.pkl"), self.micro)


def test_lightning_with_gradient_accumulation_equals_one_process(tmp_path):
    strategy = LoadBalancedDDP(balancer="random:5", seed=3, monitor=fixed_metrics, start_method=resolved_start_method())
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy=strategy, max_epochs=2, precision="64-true",
                         accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(MicroNet(str(tmp_path)))
    got = [read_pickle(tmp_path / f"lightning-{r}.pkl") for r in range(3)]
    micro = np.array([read_pickle(tmp_path / f"micro-{r}.pkl") for r in range(3)])
    assert micro.shape == (3, 40), micro.shape  # 20 steps x 2 micro-batches
    assert all(g["reduction"] is None for g in got), "micro-batches of unequal size need lb.scale"
    sizes = np.array(got[0]["sizes"])[::2]  # recorded at every micro-batch
    assert (micro[:, ::2] + micro[:, 1::2] == sizes.T).all(), (micro, sizes)
    assert "lbbsp/batch_size" in got[0]["logged"], got[0]["logged"]
    assert_random5_equals_one_process(got, sizes)


class CompiledNet(Net):
    """Net that records how many frames dynamo compiled in its rank (0 would mean it ran eagerly)."""

    def on_train_end(self):
        super().on_train_end()
        frames = torch._dynamo.utils.counters["frames"]["ok"]
        write_pickle(os.path.join(self.out, f"frames-{self.trainer.global_rank}.pkl"), frames)


def test_lightning_compiled_module_equals_one_process(tmp_path):
    """trainer.fit(torch.compile(module)): Lightning compiles it again over the strategy's DDP, whose comm hook
    is the balancer's: every rank equals one process. Forked also where there is a GPU (a compiled module does not
    pickle for spawned ranks): there it fails once a test before it in this pytest worker ran a backward here."""
    strategy = LoadBalancedDDP(balancer="random:5", seed=3, monitor=fixed_metrics, start_method="fork")
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy=strategy, max_epochs=2, precision="64-true",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(torch.compile(CompiledNet(str(tmp_path)), backend="aot_eager"))
    got = [read_pickle(tmp_path / f"lightning-{r}.pkl") for r in range(3)]
    frames = [read_pickle(tmp_path / f"frames-{r}.pkl") for r in range(3)]
    assert all(f > 0 for f in frames), f"dynamo compiled nothing: {frames}"
    # no accumulation, DDP: the hook weights the mean loss (loss_reduction "auto"), no lb.scale a step
    assert all(g["reduction"] == "auto" for g in got), [g["reduction"] for g in got]
    assert_random5_equals_one_process(got, np.array(got[0]["sizes"]))


class HangNet(Net):
    """Net whose rank 2 hangs in training_step at step 3 (past every timeout; the launcher ends it)."""

    def training_step(self, batch, batch_idx):
        if self.trainer.global_rank == 2 and batch_idx == 3:
            import threading
            threading.Event().wait()  # never returns: the launcher ends this process
        return super().training_step(batch, batch_idx)


def test_lightning_hung_rank_ends_the_job_naming_it(tmp_path):
    import datetime
    strategy = LoadBalancedDDP(balancer="lbbsp-cpu", predictor="ema", monitor=fixed_metrics,
                               start_method=resolved_start_method(), timeout=datetime.timedelta(seconds=8))
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy=strategy, max_epochs=1, precision="64-true",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    with pytest.raises(Exception) as caught:
        trainer.fit(HangNet(str(tmp_path)))
    text = str(caught.value)
    assert "LoadBalancer: step 3: the gradient allreduce failed" in text, text[-3000:]
    assert "not answering: rank 2 (" in text, text[-3000:]


class Bf16Net(Net):
    """A float32 model on a learnable target under precision="bf16-mixed" (autocast on the CPU)."""

    def __init__(self, out):
        super().__init__(out)
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.dtypes = getattr(self, "dtypes", set()) | {str(out.dtype)}
        loss = F.cross_entropy(out, y)
        self.losses.append(float(loss))
        return loss

    def train_dataloader(self):
        x, _ = data()
        x = x.float()
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :CLASSES].argmax(1)),
                                           batch_size=8, shuffle=True)

    def on_train_end(self):
        write_pickle(os.path.join(self.out, f"bf16-{self.trainer.global_rank}.pkl"),
                     {"sizes": self.sizes, "losses": self.losses, "dtypes": self.dtypes})


def test_lightning_bf16_mixed_agrees_on_every_rank_and_learns(tmp_path):
    strategy = LoadBalancedDDP(balancer="random:5", seed=3, monitor=fixed_metrics, start_method=resolved_start_method())
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy=strategy, max_epochs=3, precision="bf16-mixed",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Bf16Net(str(tmp_path)))
    got = [read_pickle(tmp_path / f"bf16-{r}.pkl") for r in range(3)]
    assert all(g["dtypes"] == {"torch.bfloat16"} for g in got), [g["dtypes"] for g in got]  # under autocast
    assert all(len(g["sizes"]) == 30 and g["sizes"] == got[0]["sizes"] for g in got), "the ranks' sizes differ"
    losses = [np.nanmean([g["losses"][i] for g in got]) for i in range(30)]  # a 0-sample rank's mean is NaN
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses


def test_lightning_refuses_what_breaks_the_invariant():
    with pytest.raises(ValueError, match="ddp_comm_hook cannot be set"):
        LoadBalancedDDP(ddp_comm_hook=lambda state, bucket: None)


def test_figures_logged_at_the_steps_lightning_writes():
    """The callback logs the figures once per optimizer step that Lightning's loggers write (every
    log_every_n_steps, and the first step so callback_metrics has them), not at every step or micro-batch: each
    self.log call costs Lightning ~2 ms of CPU for the six figures."""
    from types import SimpleNamespace

    from lbbsp.lightning import LoadBalancerCallback
    lb = SimpleNamespace(stepped=True, figures=lambda: {"lbbsp/batch_size": 4.0})
    logged = []
    module = SimpleNamespace(log_dict=lambda d, **kw: logged.append((trainer.global_step, kw["on_step"])))
    callback = LoadBalancerCallback(SimpleNamespace(load_balancer=lb))
    trainer = SimpleNamespace(log_every_n_steps=5, global_step=0, should_stop=False)
    for step in range(1, 13):
        trainer.global_step = step
        for _micro_batch in range(2):  # accumulate_grad_batches=2: on_train_batch_end twice at the same step
            callback.on_train_batch_end(trainer, module, None, None, 0)
    assert logged == [(1, True), (5, True), (10, True)], logged
    trainer.should_stop, trainer.global_step = True, 13  # the last step of a stopped run is written too
    callback.on_train_batch_end(trainer, module, None, None, 0)
    trainer.log_every_n_steps, trainer.global_step = 0, 15  # Lightning writes no logs: none made
    callback.on_train_batch_end(trainer, module, None, None, 0)
    assert logged[3:] == [(13, True)], logged


def _fit(out, ckpt_path=None, **trainer_kwargs):
    strategy = LoadBalancedDDP(balancer="random:7", seed=3, monitor=fixed_metrics, start_method=resolved_start_method())
    kwargs = dict(accelerator="cpu", devices=3, strategy=strategy, max_epochs=2, precision="64-true", logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0)
    kwargs.update(trainer_kwargs)
    pl.Trainer(**kwargs).fit(Net(str(out)), ckpt_path=ckpt_path)
    return [read_pickle(out / f"lightning-{r}.pkl") for r in range(3)]


def test_lightning_checkpoint_resumes_with_the_same_sizes(tmp_path):
    for d in ("full", "first", "resumed"):
        (tmp_path / d).mkdir()
    full = _fit(tmp_path / "full")
    from lightning.pytorch.callbacks import ModelCheckpoint
    saver = ModelCheckpoint(dirpath=str(tmp_path), filename="mid", every_n_train_steps=13, save_top_k=-1)
    first = _fit(tmp_path / "first", max_steps=13, callbacks=[saver], enable_checkpointing=True)
    assert first[0]["sizes"] == full[0]["sizes"][:13], (first[0]["sizes"], full[0]["sizes"][:13])
    resumed = _fit(tmp_path / "resumed", ckpt_path=str(tmp_path / "mid.ckpt"))
    assert resumed[0]["sizes"] == full[0]["sizes"][13:], (resumed[0]["sizes"], full[0]["sizes"][13:])
    ref = one_process(20, 24, mean=True)
    for r, g in enumerate(resumed):
        rel = np.linalg.norm(g["params"] - ref) / np.linalg.norm(ref)
        assert rel < 1e-10, f"rank {r}: relative difference {rel:.3g} from one process"


class SlowNet(Net):
    """Net whose last rank sleeps 5x longer per sample in training_step (a straggler inside the step)."""

    def training_step(self, batch, batch_idx):
        import time
        x, y = batch
        time.sleep(len(y) * (1.5e-3 if self.trainer.global_rank == 2 else 3e-4))
        return F.cross_entropy(self.net(x), y)

    def train_dataloader(self):
        g = np.random.default_rng(1)
        x = torch.from_numpy(g.normal(size=(64 * 25, 12)))
        y = torch.from_numpy(g.integers(0, CLASSES, 64 * 25))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64 // 3 + 1)


def test_lightning_slowed_rank_gets_fewer_samples(tmp_path):
    strategy = LoadBalancedDDP(balancer="lbbsp-cpu", predictor="ema", global_batch=64, monitor=fixed_metrics,
                               start_method=resolved_start_method())
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy=strategy, max_epochs=1, precision="64-true",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(SlowNet(str(tmp_path)))
    sizes = read_pickle(tmp_path / "lightning-0.pkl")["sizes"][-1]
    assert sum(sizes) == 64
    assert sizes[2] < 0.5 * min(sizes[0], sizes[1]), sizes


def test_example_runs(tmp_path):
    import subprocess
    import sys
    src = source_dir()
    data_file = tmp_path / "synth.h5"
    synth_images(data_file)
    run = subprocess.run([sys.executable, os.path.join(src, "examples", "lightning_fmnist.py"), "--data",
                          str(data_file), "--devices", "2", "--epochs", "2", "--batch-size", "30", "--slow",
                          "1:0.002"], capture_output=True, text=True, timeout=500)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "val_accuracy 0." in run.stdout or "val_accuracy 1." in run.stdout, run.stdout


_POPEN_SCRIPT = """
import sys
import lightning.pytorch as pl
from lbbsp.lightning import LoadBalancedDDP
from harness import fixed_metrics
from test_lightning import Net

if __name__ == "__main__":  # Lightning's default launcher runs this file again for ranks 1 and 2
    strategy = LoadBalancedDDP(balancer="random:5", seed=3, monitor=fixed_metrics)  # start_method "popen"
    trainer = pl.Trainer(accelerator="cpu", devices=3, strategy=strategy, max_epochs=2, precision="64-true",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Net(sys.argv[1]))
"""


def test_lightning_script_launcher_equals_one_process(tmp_path):
    """A training script run as `python train.py` with devices=3: Lightning's default (popen) launcher starts ranks
    1 and 2 as new processes of the same script, which build their own strategy and balancer."""
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(_POPEN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                                        os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    got = [read_pickle(tmp_path / f"lightning-{r}.pkl") for r in range(3)]
    assert_random5_equals_one_process(got, np.array(got[0]["sizes"]))
