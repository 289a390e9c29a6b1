"""LB-BSP for PyTorch: per-rank batch sizes in torch.distributed, re-sized every step, with exact aggregation.

    from lbbsp.torch import LoadBalancer
    lb = LoadBalancer(ddp_model, dataset_size=len(data), global_batch=256, balancer="lbbsp-cpu", predictor="narx")
    for epoch in range(lb.epoch, epochs):
        for step in range(lb.global_step % lb.steps_per_epoch, lb.steps_per_epoch):
            idx = lb.indices(epoch, step)          # this rank's samples of this global step (may be empty)
            loss = lb.scale(F.cross_entropy(ddp_model(x[idx]), y[idx]))   # mean over the rank's samples, scaled
            loss.backward()
            opt.step(); opt.zero_grad()
            lb.step()                              # every rank's time and metrics to rank 0, next sizes back

The global batch of step k is positions [kX, (k+1)X) of ``lbbsp.epoch_permutation(n, seed, epoch)``, cut by
prefix sums of the batch vector: the same samples in the same order as ``lbbsp train``. The constructor registers a
DDP communication hook that SUMS gradients (DDP's default divides by the world size); ``lb.scale(loss)`` turns a
loss that is the mean over this rank's n_r samples into n_r / X of it (X the global batch), so every rank's part
adds up to the gradient of the global batch's mean loss, for any split, ranks with 0 samples included: the
trajectory equals one process on the same global batches.

The time a rank reports for a step is everything it does from leaving one ``step()`` to entering the next (data
loading, forward, backward, the optimizer step, anything else), less the time its gradient allreduce waited for the
others (from its last gradient bucket being ready to that allreduce completing, seen by the comm hook) and less
``untimed()`` blocks. ``step()`` gathers every rank's report on rank 0 in one small collective of its own process
group, rank 0 runs the C++ balancer, and one broadcast returns the sizes: every rank holds the same sizes at every
step. With ``lag=L`` the sizes of step k+L+1 are decided after step k, so a DataLoader whose workers read P batches
ahead needs ``lag >= P`` (``required_lag(num_workers, prefetch_factor)``).
"""

from .controller import LoadBalancer
from .hooks import sum_allreduce_hook
from .launch import init_from_env
from .monitor import ResourceMonitor
from .sampler import AllowEmpty, BalancedBatchSampler, required_lag

__all__ = ["LoadBalancer", "BalancedBatchSampler", "sum_allreduce_hook", "ResourceMonitor", "init_from_env",
           "required_lag", "AllowEmpty"]
