"""The decided batch vectors, by global step: what every rank holds alike, from the step in progress up to the
furthest one decided (``lag`` ahead), and the steps whose reports are still to be checked against them."""

from typing import Dict, Iterator, List, Sequence

import numpy as np

from .sampler import step_name


class DecidedSizes:
    """Batch vectors (int64, one entry per rank) keyed by global step."""

    def __init__(self, vectors: Dict[int, np.ndarray]) -> None:
        self._by_step = dict(vectors)

    @classmethod
    def repeated(cls, first: int, last: int, vector: np.ndarray) -> "DecidedSizes":
        """Steps first..last all with ``vector``."""
        return cls({g: vector for g in range(first, last + 1)})

    @classmethod
    def from_saved(cls, saved: Sequence[Sequence[int]], first: int, last: int) -> "DecidedSizes":
        """Steps first..last from a state's list of vectors (the one of step ``first`` first); steps past its end
        repeat its last vector."""
        if not isinstance(saved, (list, tuple)) or not saved:
            raise ValueError("LoadBalancer.load_state_dict: the state's sizes must be a non-empty list of batch "
                             f"vectors (as state_dict() saves them), got {type(saved).__name__}")
        vectors: Dict[int, np.ndarray] = {}
        current = np.asarray(saved[0], dtype=np.int64)
        for i, g in enumerate(range(first, last + 1)):
            if i < len(saved):
                current = np.asarray(saved[i], dtype=np.int64)
            vectors[g] = current
        return cls(vectors)

    def __contains__(self, step: int) -> bool:
        return step in self._by_step

    def __getitem__(self, step: int) -> np.ndarray:
        return self._by_step[step]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._by_step))

    def decide(self, step: int, vector: np.ndarray) -> None:
        self._by_step[step] = vector

    def forget_through(self, step: int) -> None:
        """Drops the vectors of steps up to ``step`` (decided from and past)."""
        for g in [g for g in self._by_step if g <= step]:
            del self._by_step[g]

    def extend_to(self, last: int) -> None:
        """Steps after the furthest decided one, up to ``last``, repeat its vector."""
        furthest = max(self._by_step)
        for g in range(furthest + 1, last + 1):
            self._by_step[g] = self._by_step[furthest].copy()

    def not_decided(self, global_step: int, current: int, steps_per_epoch: int, lag: int, backward_ran: bool) -> str:
        """The error for a step whose vector is not here: past (the run is at ``current``) or not decided yet
        (``backward_ran``: step ``current``'s backward has run but its step() has not)."""
        epoch, step = divmod(global_step, steps_per_epoch)
        if global_step < current:
            return (f"LoadBalancer: step {step} of epoch {epoch} is past: the run is at step {current} "
                    f"({step_name(current, steps_per_epoch)}); continue from lb.global_step (a sampler "
                    "from lb.batch_sampler() starts there by itself)")
        known = list(self)
        why = (f"step {current}'s backward has run but lb.step() has not: call lb.step() once per step, "
               "after opt.step()" if backward_ran else
               "a DataLoader prefetching P batches ahead needs lag >= P (num_workers * prefetch_factor: "
               "lbbsp.torch.required_lag)")
        return (f"LoadBalancer: the sizes of step {step} of epoch {epoch} (global step {global_step}) are not "
                f"decided yet: the run is at step {current} and decides lag={lag} steps ahead (known: "
                f"steps {known[0]}..{known[-1]}); {why}")

    def as_lists(self, first: int, last: int) -> List[List[int]]:
        """The vectors of steps first..last as lists (a state's one leaf for torch.distributed.checkpoint)."""
        return [self._by_step[g].tolist() for g in range(first, last + 1)]


def micro_split(batch: int, parts: int) -> List[int]:
    """A batch cut into ``parts`` micro-batches, sizes differing by at most one (the first ones larger)."""
    q, r = divmod(batch, parts)
    return [q + 1] * r + [q] * (parts - r)
