"""LB-BSP under Hugging Face Accelerate: ``lbbsp.accelerate.prepare`` in place of ``accelerator.prepare`` for the
training model, optimizer and DataLoader; the loop stays as Accelerate users write it.

    accelerator = Accelerator()
    model, optimizer, loader, lb = lbbsp.accelerate.prepare(accelerator, model, optimizer, loader,
                                                            balancer="lbbsp-cpu")
    for epoch in range(lb.epoch, epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)     # the usual mean loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

``prepare`` calls ``accelerator.prepare(model, optimizer)`` (DDP), builds an ``lbbsp.torch.LoadBalancer`` on the
DDP model (its SUM hook), replaces the DataLoader by the balancer's over the same dataset (per-rank sizes re-sized
every step; Accelerate's sharding is not applied to it), makes ``accelerator.backward`` scale the loss to the rank's
share of the global batch first, makes ``optimizer.step()`` end with ``lb.step()``, and registers the balancer for
``accelerator.save_state`` / ``load_state``. Needs ``pip install accelerate``.

FSDP2: with ``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2, ...))`` (GPUs: Accelerate
1.15 applies the plugin only to multi-GPU and other accelerator runs, and ignores it on CPUs, where it wraps the
model in DDP) ``accelerator.prepare`` shards the model and the balancer is built on the sharded model (its SUM
reductions). A model sharded before ``prepare`` (``fully_shard`` on its blocks and on the root, any device and
process-group backend, gloo included) is used as it is: Accelerate registers it without wrapping it in DDP
(``prepare_model(model, evaluation_mode=True)``: mixed precision and torch.compile as configured), and
``accelerator.accumulate(model)`` / ``no_sync(model)`` skip its reduce-scatters before a step's last micro-batch.
``accelerator.save_state`` cannot save such a model (it saves the main process's tensors) and says so: save the
model, the optimizer and ``lb.state_dict()`` with ``torch.distributed.checkpoint`` (docs/accelerate.md).
"""

import contextlib
import os
from typing import Any, Callable, Iterator, Optional, Tuple

import torch
import torch.distributed as dist

from .torch import LoadBalancer
from .torch._util import uncompiled
from .torch.exchange import is_collective_error
from .torch.fsdp import is_fsdp2
from .torch.sampler import default_global_batch, require_map_style

__all__ = ["prepare"]


def prepare(accelerator: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            dataloader: torch.utils.data.DataLoader, *, global_batch: Optional[int] = None,
            balancer: str = "lbbsp-cpu", predictor: str = "narx", seed: int = 1, min_batch: int = 0,
            timeout_s: Optional[float] = None,
            monitor: Optional[Callable[[], Any]] = None) -> Tuple[Any, Any, Any, LoadBalancer]:
    """Prepares (model, optimizer, dataloader) with ``accelerator`` and balances them; returns the prepared model
    and optimizer, the balanced DataLoader and the LoadBalancer. ``global_batch`` (samples per optimizer step)
    defaults to the DataLoader's ``batch_size`` times the number of processes times the accelerator's
    ``gradient_accumulation_steps``; with accumulation each rank's slice is cut into that many micro-batches, which
    the loader yields one by one: train them inside ``with accelerator.accumulate(model):`` as usual."""
    if not isinstance(dataloader, torch.utils.data.DataLoader):
        raise TypeError(f"lbbsp.accelerate.prepare: dataloader must be a torch DataLoader (not yet prepared), got "
                        f"{type(dataloader).__name__}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(_no_process_group())
    dataset, accumulate = dataloader.dataset, int(getattr(accelerator, "gradient_accumulation_steps", 1))
    require_map_style(dataset, "lbbsp.accelerate.prepare")
    if global_batch is None:
        global_batch = default_global_batch(dataloader, accelerator.num_processes, accumulate,
                                            "lbbsp.accelerate.prepare", "global_batch=")
    sharded = uncompiled(model)
    if is_fsdp2(sharded) and not getattr(accelerator, "is_fsdp2", False):
        # Sharded by the user; Accelerate without its FSDP2 plugin (the CPU) would wrap it in DDP, which refuses
        # its DTensor parameters: registered as it is (mixed precision and compile applied, no DDP).
        model = accelerator.prepare_model(model, evaluation_mode=True)
        optimizer = accelerator.prepare_optimizer(optimizer)
        _sync_once_per_step(accelerator, model, sharded)
        _refuse_save_state(accelerator)
    else:
        model, optimizer = accelerator.prepare(model, optimizer)
    if is_fsdp2(uncompiled(model)):
        balanced: Optional[torch.nn.Module] = uncompiled(model)  # FSDP2: Accelerate's plugin or the user's
    else:
        balanced = model if hasattr(model, "register_comm_hook") else None  # DDP
    lb = LoadBalancer(balanced, dataset_size=len(dataset), global_batch=global_batch, balancer=balancer,
                      predictor=predictor, seed=seed, min_batch=min_batch, timeout_s=timeout_s, monitor=monitor,
                      micro_batches=accumulate)
    prefetch = dataloader.prefetch_factor if dataloader.num_workers > 0 else None
    loader = lb.data_loader(dataset, num_workers=dataloader.num_workers, prefetch_factor=prefetch,
                            collate_fn=dataloader.collate_fn, pin_memory=dataloader.pin_memory,
                            persistent_workers=dataloader.persistent_workers)
    _scale_backward(accelerator, lb)
    _step_after(accelerator, optimizer, lb)
    accelerator.register_for_checkpointing(lb)
    return model, optimizer, loader, lb


def _sync_once_per_step(accelerator: Any, model: Any, sharded: torch.nn.Module) -> None:
    """accelerator.no_sync(model), which accelerator.accumulate(model) enters on all but a step's last
    micro-batch: for a model the user sharded, FSDP2's set_requires_gradient_sync(False) (Accelerate's own no_sync
    knows DDP's and its FSDP2 plugin's models only; without it every micro-batch would reduce-scatter, and the
    balancer's report would leave after the first)."""
    original = accelerator.no_sync

    @contextlib.contextmanager
    def no_sync(m: Any = None) -> Iterator[None]:
        if m is not model and uncompiled(m) is not sharded:
            with original(m):
                yield
            return
        sharded.set_requires_gradient_sync(False)  # type: ignore[operator]
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)  # type: ignore[operator]
    accelerator.no_sync = no_sync


def _refuse_save_state(accelerator: Any) -> None:
    """accelerator.save_state() would save the sharded model as its main process's shards (safetensors fails on
    them: "invalid python storage"); say what saves it instead."""
    def save_state(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("lbbsp.accelerate: accelerator.save_state cannot save a model sharded with fully_shard "
                           "before prepare (Accelerate saves the main process's tensors, not every rank's shard): "
                           "save the model, the optimizer and the balancer with torch.distributed.checkpoint, "
                           "dcp.save({'model': model_state, 'optim': optim_state, 'lb': lb.state_dict()}, "
                           "checkpoint_id=DIR) with (model_state, optim_state) = torch.distributed.checkpoint."
                           "state_dict.get_state_dict(model, optimizer.optimizer)")
    accelerator.save_state = save_state


def _no_process_group() -> str:
    """Why there is no process group, and how to launch; `accelerate launch --cpu --num_processes N` without an MPI
    host file starts the script once (Accelerate runs several CPU processes only through mpirun)."""
    if "ACCELERATE_USE_CPU" in os.environ:  # set by accelerate launch's simple (CPU) launcher
        return ("lbbsp.accelerate.prepare: no process group: `accelerate launch` started this script as one "
                "process. On CPUs Accelerate starts several only through mpirun: add `--mpirun_hostfile FILE` (a "
                "line `localhost slots=N` for one machine) to `--num_processes N`, or launch with "
                "`torchrun --nproc_per_node N`")
    return ("lbbsp.accelerate.prepare: no process group: launch on more than one process (`accelerate launch "
            "--num_processes N` on GPUs, `torchrun --nproc_per_node N`, or `accelerate launch --cpu --num_processes "
            "N --mpirun_hostfile FILE` on CPUs)")


def _scale_backward(accelerator: Any, lb: LoadBalancer) -> None:
    """accelerator.backward(loss) scales a loss that is the mean over the rank's (micro-)batch to its share of the
    global batch first; Accelerate then divides by gradient_accumulation_steps, which the balancer's weighting by
    each micro-batch's own size replaces (so it is multiplied back). With DDP and no accumulation the DDP hook
    weights the gradients instead (the default loss_reduction, "auto") and the loss goes through as it is."""
    original = accelerator.backward

    def backward(loss: torch.Tensor, **kwargs: Any) -> Any:
        scaled = loss if lb.loss.reduction is not None else lb.scale(loss) * lb.micro_batches
        try:
            return original(scaled, **kwargs)
        except RuntimeError as e:  # a peer hung past the timeout or died: say which
            if not is_collective_error(e):
                raise
            raise lb.collective_failed(e) from e
    accelerator.backward = backward


def _step_after(accelerator: Any, optimizer: Any, lb: LoadBalancer) -> None:
    """optimizer.step() ends the balancer's step too (also when a GradScaler skipped the update), on the steps
    where Accelerate syncs the gradients (every gradient_accumulation_steps-th call inside accumulate()), and logs
    ``lb.figures()`` with ``accelerator.log`` where trackers are configured (``log_with=``)."""
    original = optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if accelerator.sync_gradients:
            lb.step()
            if accelerator.trackers:  # the balancer's figures through Accelerate's own logger
                accelerator.log(lb.figures(), step=lb.global_step)
        return out
    optimizer.step = step
