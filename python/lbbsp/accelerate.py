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
"""

import os
from typing import Any, Callable, Optional, Tuple

import torch
import torch.distributed as dist

from .torch import LoadBalancer
from .torch.exchange import is_collective_error
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
    model, optimizer = accelerator.prepare(model, optimizer)
    ddp = model if hasattr(model, "register_comm_hook") else None
    lb = LoadBalancer(ddp, dataset_size=len(dataset), global_batch=global_batch, balancer=balancer,
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
    each micro-batch's own size replaces (so it is multiplied back)."""
    original = accelerator.backward

    def backward(loss: torch.Tensor, **kwargs: Any) -> Any:
        scaled = lb.scale(loss) * lb.micro_batches
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
