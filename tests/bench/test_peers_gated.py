"""The gated comparison scores every fit by one function: for mixreg's fits it agrees with the
estimator's own gated log-likelihood and most likely values."""

from __future__ import annotations

import numpy as np
import pytest

from bench.peers_gated import GatedFit, holdout_scores, r_unavailable_reason
from mixreg import MixtureOfLinearRegressions
from mixreg.datasets import make_gated


def test_holdout_scores_agree_with_the_estimator():
    data = make_gated(n_samples=900, n_features=2, n_components=3, n_concomitant=2, random_state=4)
    train, test = slice(0, 700), slice(700, None)
    model = MixtureOfLinearRegressions(
        n_components=3, algorithm="am-classic", gating=True, random_state=0
    ).fit(data.X[train], data.y[train], concomitant=data.concomitant[train])
    fit = GatedFit(
        coef=model.coef_,
        intercept=model.intercept_,
        sigma=np.sqrt(model.noise_variance_),
        gate_coef=model.gate_coef_,
        gate_intercept=model.gate_intercept_,
        seconds=0.0,
        cpu_seconds=0.0,
        train_log_likelihood=model.log_likelihood_,
    )
    X, y, Z = data.X[test], data.y[test], data.concomitant[test]
    scores = holdout_scores(fit, X, y, Z)
    assert scores["holdout_log_likelihood"] == pytest.approx(
        model.gated_log_likelihood(X, y, Z), rel=1e-10
    )
    rmse = np.sqrt(np.mean((y - model.predict_most_likely(X, Z)) ** 2))
    assert scores["rmse_most_likely"] == pytest.approx(rmse, rel=1e-12)


def test_a_missing_rscript_is_reported_not_raised():
    assert "not on the PATH" in str(r_unavailable_reason("no-such-rscript-here"))
