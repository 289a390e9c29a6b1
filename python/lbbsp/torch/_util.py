"""Argument checks shared by the modules of lbbsp.torch (lbbsp's own, lbbsp._checks, with its messages), and the
module under torch.compile's wrapper."""

import sys
from typing import Any

from .._checks import check_int


def uncompiled(model: Any) -> Any:
    """The module torch.compile wrapped (its OptimizedModule keeps it as ``_orig_mod``), else ``model`` itself.
    A type check, not getattr (FSDP1's __getattr__ recurses without end on a missing attribute), and only where
    Dynamo is loaded already (torch.compile loads it; importing it costs ~1.7 s)."""
    frames = sys.modules.get("torch._dynamo.eval_frame")
    return model._orig_mod if frames is not None and isinstance(model, frames.OptimizedModule) else model


def positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """lbbsp._checks.check_int with lbbsp.torch's defaults: at least 1, messages starting ``LoadBalancer: ``."""
    return check_int(value, name, minimum, prefix="LoadBalancer: ")
