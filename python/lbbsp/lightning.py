"""LB-BSP for PyTorch Lightning: ``Trainer(strategy=LoadBalancedDDP(), ...)``, the LightningModule unchanged; or,
for a model sharded with FSDP2 in ``configure_model``, ``strategy=LoadBalancedModelParallel()``.

    import lightning as L
    from lbbsp.lightning import LoadBalancedDDP
    trainer = L.Trainer(accelerator="cpu", devices=4, strategy=LoadBalancedDDP(balancer="lbbsp-cpu"))
    trainer.fit(module, datamodule)        # training_step returns the usual mean loss

The strategy is Lightning's DDPStrategy plus an ``lbbsp.torch.LoadBalancer``: the training DataLoader is rebuilt
over the same dataset with the balancer's batch sampler (per-rank sizes re-sized every step, the global batch of
each step cut from ``lbbsp.epoch_permutation(len(dataset), seed, epoch)``), the loss ``training_step`` returns (a
mean over the rank's batch) is weighted by the rank's share of the global batch (by the comm hook, or scaled
before backward with gradient accumulation), gradients are summed by the balancer's comm hook, and
``LoadBalancer.step()`` follows every optimizer step. Sizes, predicted speeds and the step's wait are logged with
``self.log`` at Lightning's ``log_every_n_steps``; the balancer's state travels in Lightning checkpoints
(``ModelCheckpoint``, ``ckpt_path=``). Needs ``pip install lightning`` (``pip install .[lightning]``).

LoadBalancedModelParallel does the same on Lightning's ModelParallelStrategy (FSDP2: the LightningModule's
``configure_model`` applies ``fully_shard`` to its blocks and to one root module, over
``self.device_mesh["data_parallel"]`` or a 2-D mesh of its own for HSDP); the balancer sets the SUM reductions.
Lightning's FSDPStrategy is FSDP1, which the LoadBalancer refuses.
"""

import contextlib
from typing import Any, Callable, Dict, Generator, List, Optional, Union

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.states import RunningStage

from .torch import LoadBalancer
from .torch.exchange import is_collective_error
from .torch.fsdp import is_fsdp2
from .torch.sampler import default_global_batch, require_map_style

__all__ = ["LoadBalancedDDP", "LoadBalancedModelParallel", "LoadBalancerCallback"]


class LoadBalancerCallback(pl.Callback):
    """Logs the balancer's figures (``self.log``) at the optimizer steps whose logs Lightning writes (every
    ``log_every_n_steps``, and the first) and keeps its state in Lightning checkpoints (added by LoadBalancedDDP
    and LoadBalancedModelParallel; no need to list it in ``callbacks=``)."""

    def __init__(self, strategy: "_LoadBalancing") -> None:
        self.strategy = strategy
        self._logged_step = -1

    @property
    def state_key(self) -> str:
        return "lbbsp.LoadBalancer"

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        lb = self.strategy.load_balancer
        if lb is None or not lb.stepped or not self._logs_now(trainer):
            return
        self._logged_step = trainer.global_step
        pl_module.log_dict(lb.figures(), on_step=True, on_epoch=False, reduce_fx="mean", sync_dist=False)

    def _logs_now(self, trainer: pl.Trainer) -> bool:
        """Whether this optimizer step's figures are logged: where Lightning writes its loggers, and the first step
        (so ``callback_metrics`` has them from the start). ``self.log`` of the six figures costs ~2 ms of CPU a
        rank (2026-12-07; 15% of a 15 ms step), and what is logged between is never written."""
        n, step = trainer.log_every_n_steps, trainer.global_step
        if n <= 0 or step == self._logged_step:  # a micro-batch after its step's logs
            return False
        return step % n == 0 or step == 1 or trainer.should_stop

    def state_dict(self) -> Dict[str, Any]:
        lb = self.strategy.load_balancer
        return {} if lb is None else lb.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if state_dict:
            self.strategy._pending_state = state_dict


class _LoadBalancing:
    """What the load-balanced strategies share, mixed in before the Lightning strategy they extend: the balanced
    training DataLoader, the loss scaled before backward, ``lb.step()`` after the optimizer step, the callback that
    logs the figures and keeps the state. A subclass says which module the LoadBalancer is built on
    (``_balanced_model``)."""

    lightning_module: pl.LightningModule
    world_size: int

    def _init_balancing(self, balancer: str, predictor: str, global_batch: Optional[int], seed: int, min_batch: int,
                        timeout_s: Optional[float], monitor: Optional[Callable[[], Any]]) -> None:
        self._lb_args = dict(balancer=balancer, predictor=predictor, seed=seed, min_batch=min_batch,
                             timeout_s=timeout_s, monitor=monitor)
        self._global_batch = global_batch
        self.load_balancer: Optional[LoadBalancer] = None
        self._pending_state: Optional[Dict[str, Any]] = None

    def _balanced_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def setup_environment(self) -> None:
        super().setup_environment()  # type: ignore[misc]
        trainer = self.lightning_module.trainer
        if not any(isinstance(c, LoadBalancerCallback) for c in trainer.callbacks):
            trainer.callbacks.append(LoadBalancerCallback(self))  # before Lightning restores callbacks' state

    def process_dataloader(self, dataloader: object) -> object:
        dataloader = super().process_dataloader(dataloader)  # type: ignore[misc]
        trainer = self.lightning_module.trainer
        if trainer.state.stage != RunningStage.TRAINING or not isinstance(dataloader, torch.utils.data.DataLoader):
            return dataloader
        return self._balanced(dataloader)

    def _balanced(self, dataloader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        dataset, trainer, name = dataloader.dataset, self.lightning_module.trainer, type(self).__name__
        require_map_style(dataset, f"{name} (the training DataLoader)")
        global_batch = self._global_batch
        if global_batch is None:
            global_batch = default_global_batch(dataloader, self.world_size, trainer.accumulate_grad_batches,
                                                f"{name} (the training DataLoader)", f"{name}(global_batch=...)")
        if self.load_balancer is None:
            model, accumulate = self._balanced_model(), trainer.accumulate_grad_batches
            self.load_balancer = LoadBalancer(model, dataset_size=len(dataset), global_batch=global_batch,
                                              micro_batches=accumulate,
                                              **self._lb_args)
        self._check_accumulation()
        if self._pending_state is not None:
            self.load_balancer.load_state_dict(self._pending_state)
            self._pending_state = None
        kwargs = dict(pin_memory=dataloader.pin_memory, timeout=dataloader.timeout,
                      worker_init_fn=dataloader.worker_init_fn,
                      multiprocessing_context=dataloader.multiprocessing_context,
                      persistent_workers=dataloader.persistent_workers)
        prefetch = dataloader.prefetch_factor if dataloader.num_workers > 0 else None
        # Lightning counts the batches done before a mid-epoch resume and stops at the epoch's length itself;
        # the sampler yields the rest of the epoch from lb.global_step.
        return self.load_balancer.data_loader(dataset, num_workers=dataloader.num_workers, prefetch_factor=prefetch,
                                              collate_fn=dataloader.collate_fn, whole_epoch_len=True, **kwargs)

    def _check_accumulation(self) -> None:
        accumulate = self.lightning_module.trainer.accumulate_grad_batches
        if self.load_balancer is not None and accumulate != self.load_balancer.micro_batches:
            raise ValueError(f"{type(self).__name__}: accumulate_grad_batches changed from "
                             f"{self.load_balancer.micro_batches} to {accumulate} (a GradientAccumulationScheduler?): "
                             "the balancer cuts each step into a fixed number of micro-batches; keep it constant")

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        lb = self.load_balancer
        if lb is not None and self.lightning_module.trainer.training and lb.loss.reduction is None:
            # Lightning divided the micro-batch's mean loss by accumulate_grad_batches; the balancer weights each
            # micro-batch by its own size instead: its share of the step's global batch. (With one micro-batch
            # and DDP the hook weights the gradients: the default loss_reduction, "auto".)
            closure_loss = lb.scale(closure_loss * lb.micro_batches)
        try:
            return super().backward(closure_loss, optimizer, *args, **kwargs)  # type: ignore[misc]
        except RuntimeError as e:  # a peer hung past the timeout or died: say which
            if lb is None or not is_collective_error(e):
                raise
            raise lb.collective_failed(e) from e

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        self._check_accumulation()
        out = super().optimizer_step(optimizer, closure, model, **kwargs)  # type: ignore[misc]
        if self.load_balancer is not None:
            self.load_balancer.step()
        return out


class LoadBalancedDDP(_LoadBalancing, DDPStrategy):
    """Lightning's DDPStrategy with LB-BSP per-rank batch sizes.

    Args:
        balancer, predictor, seed, min_batch, timeout_s, monitor: as for ``lbbsp.torch.LoadBalancer``.
        global_batch: samples per optimizer step over all ranks; default the training DataLoader's ``batch_size``
            times the world size times ``accumulate_grad_batches`` (what plain DDP steps on).
        **ddp_kwargs: passed to DDPStrategy (``start_method``, ``timeout``, ``find_unused_parameters``...); a
            ``ddp_comm_hook`` is refused: the balancer's SUM hook is the one that keeps the invariant.

    What it changes: the training DataLoader (rebuilt with the balancer's sampler; its ``sampler``/``shuffle``
    and Lightning's DistributedSampler are replaced, the last ``len(dataset) % global_batch`` samples of an epoch
    are dropped), the loss before backward (``lb.scale``), the gradient reduction (a SUM). Validation, test and
    predict loaders are left as Lightning makes them (not balanced). ``accumulate_grad_batches=A`` cuts each
    rank's slice of a step into A micro-batches (the global batch is still ``global_batch`` per optimizer step).
    """

    def __init__(self, balancer: str = "lbbsp-cpu", predictor: str = "narx", global_batch: Optional[int] = None,
                 seed: int = 1, min_batch: int = 0, timeout_s: Optional[float] = None,
                 monitor: Optional[Callable[[], Any]] = None, **ddp_kwargs: Any) -> None:
        if ddp_kwargs.get("ddp_comm_hook") is not None:
            raise ValueError("LoadBalancedDDP: ddp_comm_hook cannot be set: the balancer registers the SUM hook "
                             "that makes any split equal one process")
        super().__init__(**ddp_kwargs)
        self._init_balancing(balancer, predictor, global_batch, seed, min_batch, timeout_s, monitor)

    def _balanced_model(self) -> torch.nn.Module:
        return self.model  # the DDP-wrapped LightningModule


class LoadBalancedModelParallel(_LoadBalancing, ModelParallelStrategy):
    """Lightning's ModelParallelStrategy (FSDP2) with LB-BSP per-rank batch sizes, for a LightningModule whose
    ``configure_model`` applies ``fully_shard`` to its blocks and to one root module that holds every trainable
    parameter (the usual FSDP2 recipe)::

        def configure_model(self):
            mesh = self.device_mesh["data_parallel"]
            for block in self.net.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

        trainer = L.Trainer(accelerator="cpu", devices=4, strategy=LoadBalancedModelParallel(balancer="lbbsp-cpu"))

    HSDP: build the 2-D mesh in ``configure_model`` (``init_device_mesh(device, (replicas, shards),
    mesh_dim_names=("replicate", "shard"))``) and pass it to ``fully_shard``; the balancer balances every rank.
    The LoadBalancer sets the gradient divide factor 1 and SUM reductions on every fully_shard module (leave them
    unset). With ``accumulate_grad_batches=A`` the reduce-scatters run once per step, after the last micro-batch.

    Args:
        balancer, predictor, seed, min_batch, timeout_s, monitor, global_batch: as for LoadBalancedDDP.
        data_parallel_size: ranks in Lightning's ``data_parallel`` mesh dimension; ``"auto"`` (the default) is
            every process (Lightning's own default would be the number of nodes, for tensor parallelism).
        tensor_parallel_size: must be 1: the balancer splits the global batch over data-parallel ranks, and a
            tensor-parallel group needs one batch on all its ranks.
        **kwargs: passed to ModelParallelStrategy (``save_distributed_checkpoint``, ``process_group_backend``,
            ``timeout``).

    What it changes is what LoadBalancedDDP changes (the training DataLoader, the loss before backward, the
    gradient reduction: FSDP's reduce-scatters become SUMs); checkpoints are ModelParallelStrategy's (a
    distributed checkpoint by default), with the balancer's state among the callbacks' states.
    """

    def __init__(self, balancer: str = "lbbsp-cpu", predictor: str = "narx", global_batch: Optional[int] = None,
                 seed: int = 1, min_batch: int = 0, timeout_s: Optional[float] = None,
                 monitor: Optional[Callable[[], Any]] = None, data_parallel_size: Union[str, int] = "auto",
                 tensor_parallel_size: Union[str, int] = 1, **kwargs: Any) -> None:
        if tensor_parallel_size != 1:
            raise ValueError(f"LoadBalancedModelParallel: tensor_parallel_size must be 1, got "
                             f"{tensor_parallel_size!r}: LB-BSP splits each step's batch over data-parallel ranks, "
                             "and the ranks of a tensor-parallel group need the same batch; shard the model over "
                             "every rank (fully_shard on self.device_mesh['data_parallel'])")
        super().__init__(data_parallel_size=data_parallel_size, tensor_parallel_size=1, **kwargs)
        self._init_balancing(balancer, predictor, global_batch, seed, min_batch, timeout_s, monitor)

    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":  # every process (Lightning's "auto" is the number of nodes)
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def _balanced_model(self) -> torch.nn.Module:
        return _sharded_root(self.lightning_module, "LoadBalancedModelParallel")

    @contextlib.contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Lightning's gradient accumulation: no reduce-scatter before a step's last micro-batch (Lightning blocks
        DDP's sync only; FSDP2 would reduce every micro-batch, and the balancer's report would leave after the
        first)."""
        if self.load_balancer is None:
            yield
            return
        root = self._balanced_model()
        root.set_requires_gradient_sync(False)  # type: ignore[operator]
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)  # type: ignore[operator]


def _sharded_root(module: torch.nn.Module, who: str) -> torch.nn.Module:
    """The one fully_shard module of ``module`` (itself or a submodule) above every other and holding every
    trainable parameter: the module a LoadBalancer over FSDP2 is built on."""
    if is_fsdp2(module):
        return module
    roots: List[str] = []
    for name, m in module.named_modules():
        if is_fsdp2(m) and not any(name.startswith(r + ".") for r in roots):
            roots.append(name)
    if not roots:
        raise TypeError(f"{who}: no fully_shard module in {type(module).__name__}: apply "
                        "torch.distributed.fsdp.fully_shard to the blocks and to the root module in the "
                        "LightningModule's configure_model, over self.device_mesh['data_parallel']")
    if len(roots) > 1:
        raise TypeError(f"{who}: {len(roots)} separate fully_shard roots ({', '.join(roots)}): the LoadBalancer "
                        "needs one root that holds every trainable parameter; gather the sharded parts under one "
                        "module and apply fully_shard to it last")
    root = module.get_submodule(roots[0])
    inside = {id(p) for p in root.parameters()}
    outside = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in inside]
    if outside:
        raise TypeError(f"{who}: parameters outside the fully_shard root {roots[0]!r}: {', '.join(outside[:5])}"
                        f"{'...' if len(outside) > 5 else ''}: their gradients would not be reduced; move them "
                        "into the sharded module")
    return root
