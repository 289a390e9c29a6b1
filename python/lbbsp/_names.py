"""The names the C++ core defines: its balancer and predictor kinds and the per-rank exogenous inputs."""

from . import _lbbsp

#: Balancer names (``static:K``, ``random:SEED``, ``lbbsp-cpu:PREDICTOR_SPEC``, ``lbbsp-gpu:W`` take arguments),
#: as the C++ core knows them.
BALANCERS = tuple(_lbbsp.balancer_kinds())
#: Predictor names (``ema:ALPHA``, ``arima:P,D,Q``, ``narx:key=value,...`` take arguments), from the C++ core.
PREDICTORS = tuple(_lbbsp.predictor_kinds())
#: The exogenous inputs ``lbbsp train`` and :mod:`lbbsp.torch` measure on every rank, in ``exo``'s order; the first
#: (``RANK_EXO[RANK_CAPACITY_EXO]``) is the capacity-like CPU share.
RANK_EXO = tuple(_lbbsp.RANK_EXO)
RANK_CAPACITY_EXO: int = _lbbsp.RANK_CAPACITY_EXO
