"""The memory cap on CUDA (LB-BSP's GPU balancer caps a rank's batch at what its device can hold): bytes one
sample of a step needs at its peak, from the caching allocator's counters, and the samples the free memory holds."""

from typing import Tuple

import torch


def cuda_cap(free: int, cached: int, bytes_per_sample: float) -> int:
    """Most samples a rank can hold: what its process can still use on the device (free memory plus blocks its
    caching allocator holds unused) over the bytes one sample of a step needs at its peak; at least 1."""
    return max(1, int((free + max(0, cached)) / bytes_per_sample))


class DeviceMemory:
    """A rank's memory figures on its model's CUDA device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes_per_sample = 0.0  # 0 until a step's peak has been seen: no cap
        self._max_batch = self._cached_bytes = 0
        self._resting = None  # bytes allocated at the last step() (what stays between steps)

    def allocator(self) -> Tuple[int, int, int]:
        """Bytes allocated now, at the peak and reserved on the device, in one read of the caching allocator's
        counters (torch.cuda.memory_allocated and its kin each build and flatten all ~120 of them: ~70-100 us a
        call, where a step needs three)."""
        stats = torch.cuda.memory_stats_as_nested_dict(self.device)
        allocated = stats.get("allocated_bytes", {}).get("all", {})
        reserved = stats.get("reserved_bytes", {}).get("all", {})
        return allocated.get("current", 0), allocated.get("peak", 0), reserved.get("current", 0)

    def note_resting(self) -> None:
        """At step(): what is allocated now stays between steps (the model, the optimizer's state)."""
        self._resting = self.allocator()[0]

    def note_step(self, batch: int) -> None:
        """Bytes per sample from the process's peak since the start (never reset: the user's statistics stay)
        over the largest batch seen, above what stays allocated between steps (read at the last step(), or now
        where the step's work is done); and the allocator's cached bytes, for the cap."""
        self._max_batch = max(self._max_batch, batch)
        allocated, peak, reserved = self.allocator()
        resting = self._resting if self._resting is not None else allocated
        if self._max_batch > 0 and peak > resting:
            self.bytes_per_sample = (peak - resting) / self._max_batch
        self._cached_bytes = reserved - allocated

    def cap(self) -> int:
        """Most samples this rank can hold (free device memory plus the allocator's cached blocks, over the bytes
        per sample); 0 (no cap) before a step has been seen."""
        if self.bytes_per_sample <= 0:
            return 0
        free, _ = torch.cuda.mem_get_info(self.device)
        return cuda_cap(free, self._cached_bytes, self.bytes_per_sample)
