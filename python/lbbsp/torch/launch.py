"""init_from_env: torch.distributed from the environment of torchrun, mpirun (Open MPI, MPICH) or srun."""

import datetime
import os
from typing import Dict, Optional

import torch
import torch.distributed as dist


def _launcher_env() -> Dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK from torchrun, mpirun (Open MPI, MPICH) or srun, whichever set them."""
    env = os.environ
    for rank, size, local in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                              ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
                              ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")):
        if rank in env and size in env:
            return {"RANK": env[rank], "WORLD_SIZE": env[size], "LOCAL_RANK": env.get(local, "0")}
    raise RuntimeError("init_from_env: no launcher environment found: start with torchrun, mpirun or srun "
                       "(RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_*, or SLURM_PROCID/SLURM_NTASKS)")


def init_from_env(backend: Optional[str] = None, timeout_s: Optional[float] = None) -> int:
    """init_process_group from the launcher's environment; returns the local rank. The backend defaults to NCCL
    when CUDA is available, else gloo. ``timeout_s`` None keeps PyTorch's own default timeout of the default group
    (the one DDP's gradient allreduce uses); a number sets it. Under mpirun/srun set MASTER_ADDR (rank 0's host;
    default the Slurm job's first node or 127.0.0.1) and MASTER_PORT (default 29500)."""
    ids = _launcher_env()
    os.environ.setdefault("MASTER_ADDR", _first_slurm_node() or "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(ids["LOCAL_RANK"])
    if backend == "nccl":
        torch.cuda.set_device(local % torch.cuda.device_count())
    kwargs = {}
    if timeout_s is not None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"init_from_env: timeout_s must be a positive number of seconds or None (PyTorch's "
                             f"default), got {timeout_s!r}")
        kwargs["timeout"] = datetime.timedelta(seconds=float(timeout_s))
    dist.init_process_group(backend, rank=int(ids["RANK"]), world_size=int(ids["WORLD_SIZE"]), **kwargs)
    return local


def _first_slurm_node() -> Optional[str]:
    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodes:
        return None
    try:
        import subprocess
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, timeout=10)
        return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else None
    except (OSError, subprocess.SubprocessError):
        return None
