"""The DDP communication hook that SUMS gradients over ranks (DDP's default divides by the world size)."""

from typing import Optional

import torch
import torch.distributed as dist


def sum_allreduce_hook(process_group: Optional[dist.ProcessGroup],
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the gradient SUM over ranks (DDP's default hook divides it by the world size)."""
    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    group = process_group if process_group is not None else dist.group.WORLD
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
