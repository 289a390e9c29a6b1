"""Argument checks shared by the modules of lbbsp.torch: lbbsp's own (lbbsp._checks), with its messages."""

from typing import Any

from .._checks import check_int


def positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """lbbsp._checks.check_int with lbbsp.torch's defaults: at least 1, messages starting ``LoadBalancer: ``."""
    return check_int(value, name, minimum, prefix="LoadBalancer: ")
