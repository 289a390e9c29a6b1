#!/usr/bin/env python3
"""Validates lbbsp's ARIMA (predictors/arima.cpp) against statsmodels on series generated here.

usage: arima_vs_statsmodels.py PATH_TO_arima_fit_tool

For each case: statsmodels' hannan_rissanen(diff(x, d), p, q, demean=True, unbiased=False) gives the reference
coefficients (the same two-stage estimator, so they must agree to ~1e-8), and statsmodels' state-space ARIMA
filtered with those coefficients gives the reference one-step forecast (Kalman innovations vs our conditional
residual recursion: they converge, so forecasts agree to ~1e-6 of the series' scale on these lengths).
Exit status 1 on any disagreement.
"""
import json
import subprocess
import sys
import warnings

import numpy as np
from statsmodels.tsa.arima.estimators.hannan_rissanen import hannan_rissanen
from statsmodels.tsa.arima.model import ARIMA

COEF_TOL = 1e-8   # absolute, coefficients
FORECAST_TOL = 1e-6  # relative to the series' standard deviation


def arma_series(rng, n, ar, ma, mean, d):
    burn = 200
    e = rng.standard_normal(n + burn)
    w = np.zeros(n + burn)
    for t in range(n + burn):
        w[t] = e[t] + sum(a * w[t - 1 - i] for i, a in enumerate(ar) if t - 1 - i >= 0) \
            + sum(b * e[t - 1 - j] for j, b in enumerate(ma) if t - 1 - j >= 0)
    w = w[burn:] + mean
    for _ in range(d):
        w = np.cumsum(w) + 100.0
    return w


CASES = [  # (name, p, d, q, ar, ma, mean, n, seed)
    ("AR(1)", 1, 0, 0, [0.7], [], 50.0, 200, 1),
    ("AR(2)", 2, 0, 0, [0.5, 0.3], [], 10.0, 300, 2),
    ("MA(1)", 0, 0, 1, [], [0.5], 5.0, 400, 3),
    ("ARMA(1,1)", 1, 0, 1, [0.6], [0.3], 20.0, 400, 4),
    ("ARMA(2,1)", 2, 0, 1, [0.4, 0.2], [0.4], 10.0, 500, 5),
    ("ARIMA(1,1,1)", 1, 1, 1, [0.5], [0.3], 0.1, 400, 6),
    ("ARIMA(0,1,1)", 0, 1, 1, [], [0.4], 0.0, 300, 7),
    ("ARIMA(2,1,0)", 2, 1, 0, [0.3, -0.2], [], 0.05, 300, 8),
    ("ARIMA(1,0,1) window 96", 1, 0, 1, [0.8], [-0.3], 10.0, 96, 9),
]


def main():
    tool = sys.argv[1]
    failures = 0
    for name, p, d, q, ar, ma, mean, n, seed in CASES:
        x = arma_series(np.random.default_rng(seed), n, ar, ma, mean, d)
        w = np.diff(x, n=d) if d else x
        params, _ = hannan_rissanen(w, ar_order=p, ma_order=q, demean=True, unbiased=False)
        ref_ar, ref_ma = np.atleast_1d(params.ar_params), np.atleast_1d(params.ma_params)
        mu = w.mean()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = ARIMA(w - mu, order=(p, 0, q), trend="n", enforce_stationarity=False,
                          enforce_invertibility=False)
            res = model.filter(np.r_[ref_ar, ref_ma, max(params.sigma2, 1e-12)])
        ref_forecast = float(res.forecast(1)[0]) + mu + (x[-1] if d == 1 else 0.0)
        out = subprocess.run([tool, str(p), str(d), str(q)], input=" ".join(repr(float(v)) for v in x),
                             capture_output=True, text=True, check=True)
        ours = json.loads(out.stdout)
        coef_err = max([abs(a - b) for a, b in zip(ours["ar"] + ours["ma"], list(ref_ar) + list(ref_ma))] + [0.0])
        n_coef_ok = len(ours["ar"]) == len(ref_ar) and len(ours["ma"]) == len(ref_ma)
        scale = float(np.std(w)) or 1.0
        fc_err = abs(ours["forecast"] - ref_forecast) / scale
        # The online predictor takes the same path (all series here are positive, i.e. valid speeds).
        pred_err = abs(ours["predictor"] - ours["forecast"]) / scale
        ok = ours["ok"] and n_coef_ok and coef_err <= COEF_TOL and fc_err <= FORECAST_TOL and pred_err <= 1e-12
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:24s} n={n:4d} ar={ours['ar']} ma={ours['ma']} "
              f"statsmodels ar={list(ref_ar)} ma={list(ref_ma)} |coef diff|={coef_err:.2e} "
              f"forecast ours={ours['forecast']:.10g} statsmodels={ref_forecast:.10g} rel diff={fc_err:.2e} "
              f"predictor diff={pred_err:.1e}")
    print(f"{len(CASES) - failures}/{len(CASES)} cases agree with statsmodels "
          f"(coefficients within {COEF_TOL}, forecasts within {FORECAST_TOL} x std)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
