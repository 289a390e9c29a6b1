"""LB-BSP for PyTorch: per-rank batch sizes in torch.distributed, re-sized every step, with exact aggregation.

    from lbbsp.torch import LoadBalancer
    lb = LoadBalancer(ddp_model, dataset_size=len(data), global_batch=256, balancer="lbbsp-cpu", predictor="narx")
    for epoch in range(lb.epoch, epochs):
        for step in range(lb.global_step % lb.steps_per_epoch, lb.steps_per_epoch):
            idx = lb.indices(epoch, step)          # this rank's samples of this global step (may be empty)
            F.cross_entropy(ddp_model(x[idx]), y[idx]).backward()   # the mean over the rank's samples, as in DDP
            opt.step(); opt.zero_grad()
            lb.step()                              # the coming step's sizes, decided alike on every rank

The global batch of step k is positions [kX, (k+1)X) of ``lbbsp.epoch_permutation(n, seed, epoch)``, cut by
prefix sums of the batch vector: the same samples in the same order as ``lbbsp train``. The constructor registers a
DDP communication hook that SUMS gradients (DDP's default divides by the world size), each rank's weighted by
n_r / X (X the global batch) where its loss is the mean over its n_r samples, so every rank's part adds up to the
gradient of the global batch's mean loss, for any split, ranks with 0 samples included: the trajectory equals one
process on the same global batches. ``lb.scale(loss)`` weights the loss itself instead (the hook then leaves that
step alone): for a sum loss, FSDP2, micro-batches, or no DDP model.

The time a rank reports for a step is everything it does between leaving one barrier (the gradient allreduce)
and reaching the next, less ``untimed()`` blocks. Its report leaves from the comm hook when the last gradient
bucket is ready, in one asynchronous all-gather on a gloo group of its own, and every rank runs the same C++
balancer on the same reports: every rank holds the same sizes and state at every step, and ``step()`` waits for
no other rank. With ``lag=L`` the sizes of step k+L+1 are decided after step k, so a DataLoader whose workers
read P batches ahead needs ``lag >= P`` (``required_lag(num_workers, prefetch_factor)``).
"""

from .controller import LoadBalancer
from .hooks import sum_allreduce_hook
from .launch import init_from_env
from .monitor import ResourceMonitor
from .sampler import AllowEmpty, BalancedBatchSampler, required_lag

__all__ = ["LoadBalancer", "BalancedBatchSampler", "sum_allreduce_hook", "ResourceMonitor", "init_from_env",
           "required_lag", "AllowEmpty"]
