"""lbbsp.Predictor: one worker's C++ speed predictor behind a checked Python interface, with saved state."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from . import _lbbsp
from ._checks import EMPTY_F64, check_int, check_name, float_array
from ._names import PREDICTORS


class Predictor:
    """One worker's one-step-ahead speed predictor (``last``, ``ema[:A]``, ``arima[:P,D,Q]``, ``narx[:...]``).

    Args:
        spec: predictor spec, as for ``lbbsp train --predictor``.
        num_exo: length of the exogenous vectors passed to :meth:`observe` (and usually :meth:`predict`).
        seed: seeds the NARX network's initial weights.
    """

    def __init__(self, spec: str, num_exo: int = 0, seed: int = 0) -> None:
        check_name(spec, "predictor", PREDICTORS)
        self._num_exo = check_int(num_exo, "num_exo", 0)
        self._spec = spec
        self._seed = check_int(seed, "seed", 0)
        self._impl = _lbbsp.make_predictor(spec, self._num_exo, self._seed)

    @property
    def name(self) -> str:
        return self._impl.name

    def observe(self, speed: float, exo: Optional[Sequence[float]] = None) -> None:
        """Step t's measured speed (samples/s; NaN or <= 0 mean missing) and its exogenous inputs."""
        if isinstance(speed, bool) or not isinstance(speed, (int, float, np.integer, np.floating)):
            raise TypeError(f"speed must be a number, got {type(speed).__name__}")
        x = float_array([] if exo is None else exo, "exo", (self._num_exo,), nonnegative=False)
        self._impl.observe(float(speed), x.tolist())

    def predict(self, exo_next: Optional[Sequence[float]] = None) -> float:
        """Speed expected at step t+1 given the inputs already known for it; always finite and > 0."""
        x = EMPTY_F64 if exo_next is None else float_array(exo_next, "exo_next", (None,), nonnegative=False)
        return float(self._impl.predict(x.tolist()))

    def save_state(self) -> bytes:
        return self._impl.save_state()

    def load_state(self, state: bytes) -> None:
        if not isinstance(state, (bytes, bytearray)):
            raise TypeError(f"state must be bytes from Predictor.save_state(), got {type(state).__name__}")
        try:
            self._impl.load_state(bytes(state))
        except (ValueError, RuntimeError, IndexError) as e:
            raise ValueError(f"state does not fit predictor '{self._spec}': {e}") from None

    def __getstate__(self) -> dict:
        return {"spec": self._spec, "num_exo": self._num_exo, "seed": self._seed, "state": self.save_state()}

    def __setstate__(self, s: dict) -> None:
        self.__init__(s["spec"], s["num_exo"], s["seed"])
        self.load_state(s["state"])

    def __repr__(self) -> str:
        return f"lbbsp.Predictor({self._spec!r}, num_exo={self._num_exo})"
