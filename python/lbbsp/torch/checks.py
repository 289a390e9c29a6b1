"""The LoadBalancer's checks: its model, its settings (the same on every rank) and a saved state to load."""

import contextlib
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from . import ddp, fsdp
from .exchange import ReportExchange


class BuiltAlike:
    """The construction's one all-gather, around the building of a LoadBalancer (``with BuiltAlike(exchange) as
    built: ...; built.settings = settings_of(...)``): settings that differ by rank would cut other samples (or
    sum the gradients over other ranks) while every rank's sizes still agree, so every rank raises; and a rank
    whose arguments raise still enters it, so that every other rank raises too, naming it, at once."""

    def __init__(self, exchange: ReportExchange) -> None:
        self.exchange = exchange
        self.settings: Dict[str, Any] = {}

    def __enter__(self) -> "BuiltAlike":
        return self

    def __exit__(self, kind: Any, error: Optional[BaseException], trace: Any) -> bool:
        if error is None:
            self.exchange.check_same(self.settings)
        elif isinstance(error, Exception):  # not an interrupt: this rank's own error goes on after the all-gather
            with contextlib.suppress(Exception):  # the others gone or timed out: this rank's error says more
                self.exchange.check_same({}, f"{type(error).__name__}: {error}")
        return False


def settings_of(model: Optional[torch.nn.Module], sharded: bool, ranks: List[int],
                settings: Dict[str, Any]) -> Dict[str, Any]:
    """The settings every rank must share, with the model's type and the ranks it reduces over."""
    model_ranks = fsdp.model_ranks(model) if sharded else ddp.model_ranks(model, ranks)
    return {**settings, "model": type(model).__name__ if model is not None else None, "model_group": model_ranks}


def check_model_group(model_ranks: List[int], sharded: bool, ranks: List[int]) -> None:
    """The model reduces over the balanced ranks (the same verdict on every rank: checked alike first)."""
    balanced = sorted(ranks) if sharded else ranks  # a mesh's ranks, in any order
    if sharded and model_ranks != balanced:
        raise ValueError(f"LoadBalancer: the fully_shard model's device mesh spans ranks {model_ranks} but "
                         f"process_group balances over ranks {ranks}: balance over every data-parallel "
                         "rank of the mesh (with HSDP, replicas and shards alike: the default, the world, where "
                         "the mesh is the world)")
    if model_ranks != balanced:
        raise ValueError(f"LoadBalancer: the DDP model reduces its gradients over ranks {model_ranks} but "
                         f"process_group balances over ranks {ranks}: pass the DDP model's process_group "
                         "(DDP(module, process_group=g) and LoadBalancer(..., process_group=g))")


STATE_VERSION = 3  # state_dict()'s layout; docs/checkpoints.md says which versions load


def check_model(model: Optional[torch.nn.Module]) -> bool:
    """Whether the model is sharded (FSDP2); refuses FSDP1 and anything that is neither DDP nor FSDP2."""
    if fsdp.is_fsdp1(model):
        raise TypeError("LoadBalancer: FullyShardedDataParallel (FSDP1) is not supported: apply fully_shard "
                        "(FSDP2, torch.distributed.fsdp.fully_shard) to the blocks and the root instead, or use "
                        "DistributedDataParallel")
    if fsdp.is_fsdp2(model):
        return True
    ddp.check_model(model)
    return False


def timeout(timeout_s: Optional[float], fallback: bool = False) -> float:
    """The report timeout in seconds (None: PyTorch's default process-group timeout; so is a bad value with
    ``fallback``, for the all-gather in which this rank then says so)."""
    if timeout_s is None:
        timeout_s = dist.default_pg_timeout.total_seconds()
    if isinstance(timeout_s, bool) or not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        if fallback:
            return dist.default_pg_timeout.total_seconds()
        raise ValueError(f"LoadBalancer: timeout_s must be a positive number of seconds or None (PyTorch's "
                         f"default process-group timeout), got {timeout_s!r}")
    return float(timeout_s)


def check_state(state: Any, lb: Any) -> None:
    """A LoadBalancer state of this layout, of a run over the same samples."""
    if not isinstance(state, dict) or "step" not in state:
        raise TypeError("LoadBalancer.load_state_dict: state must be the dict from LoadBalancer.state_dict()")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"LoadBalancer.load_state_dict: the state is version {state.get('version')!r}, this "
                         f"lbbsp reads version {STATE_VERSION} (states of earlier development versions are not "
                         "read): start the balancer afresh (no load_state_dict) or save the state again with "
                         "this version")
    for key in ("global_batch", "dataset_size", "seed"):
        if state.get(key) != getattr(lb, key):
            raise ValueError(f"LoadBalancer.load_state_dict: {key} is {state.get(key)!r} in the state and "
                             f"{getattr(lb, key)!r} here: they define the samples of every step; resume "
                             "with the same ones")
