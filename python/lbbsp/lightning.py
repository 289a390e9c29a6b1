"""LB-BSP for PyTorch Lightning: ``Trainer(strategy=LoadBalancedDDP(), ...)``, the LightningModule unchanged.

    import lightning as L
    from lbbsp.lightning import LoadBalancedDDP
    trainer = L.Trainer(accelerator="cpu", devices=4, strategy=LoadBalancedDDP(balancer="lbbsp-cpu"))
    trainer.fit(module, datamodule)        # training_step returns the usual mean loss

The strategy is Lightning's DDPStrategy plus an ``lbbsp.torch.LoadBalancer``: the training DataLoader is rebuilt
over the same dataset with the balancer's batch sampler (per-rank sizes re-sized every step, the global batch of
each step cut from ``lbbsp.epoch_permutation(len(dataset), seed, epoch)``), the loss ``training_step`` returns (a
mean over the rank's batch) is scaled to the rank's share of the global batch before backward, gradients are
summed by the balancer's comm hook, and ``LoadBalancer.step()`` follows every optimizer step. Sizes, predicted
speeds and the step's wait are logged with ``self.log``; the balancer's state travels in Lightning checkpoints
(``ModelCheckpoint``, ``ckpt_path=``). Needs ``pip install lightning`` (``pip install .[lightning]``).
"""

from typing import Any, Callable, Dict, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import RunningStage

from .torch import LoadBalancer
from .torch.exchange import is_collective_error
from .torch.sampler import default_global_batch, require_map_style

__all__ = ["LoadBalancedDDP", "LoadBalancerCallback"]


class LoadBalancerCallback(pl.Callback):
    """Logs the balancer's figures each training step and keeps its state in Lightning checkpoints (added by
    LoadBalancedDDP; no need to list it in ``callbacks=``)."""

    def __init__(self, strategy: "LoadBalancedDDP") -> None:
        self.strategy = strategy

    @property
    def state_key(self) -> str:
        return "lbbsp.LoadBalancer"

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        lb = self.strategy.load_balancer
        if lb is None or not lb.stepped:
            return
        pl_module.log_dict(lb.figures(), on_step=True, on_epoch=False, reduce_fx="mean", sync_dist=False)

    def state_dict(self) -> Dict[str, Any]:
        lb = self.strategy.load_balancer
        return {} if lb is None else lb.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if state_dict:
            self.strategy._pending_state = state_dict


class LoadBalancedDDP(DDPStrategy):
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
        self._lb_args = dict(balancer=balancer, predictor=predictor, seed=seed, min_batch=min_batch,
                             timeout_s=timeout_s, monitor=monitor)
        self._global_batch = global_batch
        self.load_balancer: Optional[LoadBalancer] = None
        self._pending_state: Optional[Dict[str, Any]] = None

    def setup_environment(self) -> None:
        super().setup_environment()
        trainer = self.lightning_module.trainer
        if not any(isinstance(c, LoadBalancerCallback) for c in trainer.callbacks):
            trainer.callbacks.append(LoadBalancerCallback(self))  # before Lightning restores callbacks' state

    def process_dataloader(self, dataloader: object) -> object:
        dataloader = super().process_dataloader(dataloader)
        trainer = self.lightning_module.trainer
        if trainer.state.stage != RunningStage.TRAINING or not isinstance(dataloader, torch.utils.data.DataLoader):
            return dataloader
        return self._balanced(dataloader)

    def _balanced(self, dataloader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        dataset, trainer = dataloader.dataset, self.lightning_module.trainer
        require_map_style(dataset, "LoadBalancedDDP (the training DataLoader)")
        global_batch = self._global_batch
        if global_batch is None:
            global_batch = default_global_batch(dataloader, self.world_size, trainer.accumulate_grad_batches,
                                                "LoadBalancedDDP (the training DataLoader)",
                                                "LoadBalancedDDP(global_batch=...)")
        if self.load_balancer is None:
            self.load_balancer = LoadBalancer(self.model, dataset_size=len(dataset), global_batch=global_batch,
                                              micro_batches=trainer.accumulate_grad_batches, **self._lb_args)
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
            raise ValueError(f"LoadBalancedDDP: accumulate_grad_batches changed from "
                             f"{self.load_balancer.micro_batches} to {accumulate} (a GradientAccumulationScheduler?): "
                             "the balancer cuts each step into a fixed number of micro-batches; keep it constant")

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        lb = self.load_balancer
        if lb is not None and self.lightning_module.trainer.training:
            # Lightning divided the micro-batch's mean loss by accumulate_grad_batches; the balancer weights each
            # micro-batch by its own size instead: its share of the step's global batch.
            closure_loss = lb.scale(closure_loss * lb.micro_batches)
        try:
            return super().backward(closure_loss, optimizer, *args, **kwargs)
        except RuntimeError as e:  # a peer hung past the timeout or died: say which
            if lb is None or not is_collective_error(e):
                raise
            raise lb.collective_failed(e) from e

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        self._check_accumulation()
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.load_balancer is not None:
            self.load_balancer.step()
        return out
