"""The LoadBalancer's checkpoint: what state_dict() saves (the same on every rank: every rank runs the balancer)
and how load_state_dict() continues from it, at any step, another lag or another world size."""

import warnings
from typing import Any, Dict

from . import native
from .checks import STATE_VERSION, check_state


def state_of(lb: Any) -> Dict[str, Any]:
    """LoadBalancer.state_dict: the steps before the current one decided from first."""
    lb._decide_through(lb._step - 1, block=True)
    # "sizes": the batch vectors of steps step..step+lag, a list of lists (no tensors): one leaf for
    # torch.distributed.checkpoint, which a template of another lag or world size can load.
    return {"version": STATE_VERSION, "world_size": lb.world_size, "global_batch": lb.global_batch,
            "dataset_size": lb.dataset_size, "seed": lb.seed, "lag": lb.lag, "step": lb._step,
            "sizes": lb.sizes.as_lists(lb._step, lb._step + lb.lag),
            "balancer": lb._decisions.balancer.save_state()}


def load_into(lb: Any, state: Dict[str, Any]) -> None:
    """LoadBalancer.load_state_dict: ``state`` checked, the reports in flight drained, the balancer and the
    decided sizes restored (or restarted at another world size), the step's clock and C++ state afresh."""
    check_state(state, lb)
    lb.exchange.drain()
    step = int(state["step"])
    if lb._auto_lag and not lb._stepped:
        lb.lag = max(lb.lag, int(state.get("lag", 0)))
    if state.get("world_size") != lb.world_size:
        warnings.warn(f"LoadBalancer.load_state_dict: the state was saved at {state.get('world_size')} ranks "
                      f"and this run has {lb.world_size}: the balancer starts afresh from an equal split "
                      "(its speed history is per rank); the samples of every step stay the same")
        lb._decisions.restart(step, lb.lag)
    else:
        if state.get("balancer") is None:
            raise ValueError("LoadBalancer.load_state_dict: the state has no balancer state: save it on rank 0")
        lb._decisions.load(state["balancer"], state["sizes"], step, lb.lag)
    lb._step, lb._stepped = step, False
    lb.loss.restart()
    if lb.native is not None:
        lb.native.note_scaled(-1)  # a step scaled before the load is none of the steps to come
    lb.clock.reset()
    native.arm(lb)
