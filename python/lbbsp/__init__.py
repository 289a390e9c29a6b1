"""lbbsp: per-worker batch sizes for synchronous data-parallel training (LB-BSP, Chen et al., SoCC 2020).

The same C++ balancers, speed predictors and sampling functions that ``lbbsp train`` uses, for any trainer:

    import lbbsp
    b = lbbsp.Balancer("lbbsp-cpu", workers=4, global_batch=256, predictor="ema")
    sizes = b.initial()                                  # NumPy int64, sums to 256
    for step in range(100):
        times = run_step(sizes)                          # each worker's compute seconds for its share
        sizes = b.next(batch=sizes, compute_s=times)     # next iteration's shares

``epoch_permutation`` and ``rank_indices`` cut each step's global batch the way ``lbbsp train`` does, so any
split of the batch over workers gives the same samples in the same order (and, with summed gradients, the same
SGD trajectory).
"""


from . import _lbbsp
from ._balancer import Balancer
from ._batch import assign_by_speed, check_batch
from ._names import BALANCERS, PREDICTORS, RANK_CAPACITY_EXO, RANK_EXO
from ._predictor import Predictor
from ._sampling import epoch_permutation, rank_indices, slice_offset, steps_per_epoch

__version__: str = _lbbsp.__version__
__all__ = [
    "Balancer",
    "Predictor",
    "epoch_permutation",
    "rank_indices",
    "slice_offset",
    "steps_per_epoch",
    "check_batch",
    "assign_by_speed",
    "BALANCERS",
    "PREDICTORS",
    "RANK_EXO",
    "RANK_CAPACITY_EXO",
    "__version__",
]

# Each public class and function says it lives in lbbsp, where users import it from: help() and tracebacks show
# lbbsp.Balancer, and a pickled Balancer or Predictor names lbbsp.Balancer, not the private module defining it.
for _public in (Balancer, Predictor, epoch_permutation, rank_indices, slice_offset, steps_per_epoch, check_batch,
                assign_by_speed):
    _public.__module__ = __name__
del _public
