"""The grouped comparison scores every fit by one set of functions: they agree with the
estimator's grouped min-loss and with a group-by-group twin of the grouped likelihood, and the
report runs on cached flexmix fits without R."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from scipy.stats import norm

from bench.peers_grouped import (
    GroupedFit,
    fit_mixreg,
    grouped_log_likelihood,
    grouped_min_loss,
    main,
    movielens_style,
    scores,
    segments,
    share_on_true_segment,
)
from mixreg import MixtureOfLinearRegressions


def test_scores_agree_with_the_estimator_and_a_group_by_group_twin():
    case = segments(n_groups=30)
    model = MixtureOfLinearRegressions(3, algorithm="em", n_init=3, random_state=0)
    model.fit(case.train.X, case.train.y, groups=case.train.group)
    fit = GroupedFit(
        model.coef_,
        model.intercept_,
        np.sqrt(model.noise_variance_),
        model.weights_,
        seconds=0.0,
        cpu_seconds=0.0,
    )
    rows = case.test
    assert grouped_min_loss(fit, rows) == pytest.approx(
        model.min_loss(rows.X, rows.y, groups=rows.group), rel=1e-12
    )
    twin = 0.0
    for group in range(rows.n_groups):
        on = rows.group == group
        values = rows.X[on] @ fit.coef.T + fit.intercept
        density = norm.pdf(rows.y[on, None], values, fit.sigma).prod(axis=0)
        twin += np.log((fit.prior * density).sum())
    assert grouped_log_likelihood(fit, rows) == pytest.approx(twin, rel=1e-10)
    # Each group's most likely line under the fitted mixture is EM's own posterior's argmax.
    train_groups = case.train.segment[model.group_labels_.astype(int)]
    share = share_on_true_segment(model.group_posterior_.argmax(axis=1), train_groups, 3)
    assert scores(fit, case)["train_correct"] == share >= 0.9


def test_share_on_true_segment_matches_lines_to_segments_by_the_best_permutation():
    segment = np.array([0, 0, 1, 1, 2, 2])
    assert share_on_true_segment(np.array([2, 2, 0, 0, 1, 1]), segment, 3) == 1.0
    assert share_on_true_segment(np.array([2, 2, 0, 1, 1, 1]), segment, 3) == pytest.approx(5 / 6)
    # A line on no group still takes part in the matching.
    assert share_on_true_segment(np.array([0, 0, 0, 0, 0, 0]), segment, 3) == pytest.approx(1 / 3)


def test_the_report_runs_on_cached_flexmix_fits(tmp_path):
    # flexmix's cached fits: here mixreg's own em fits, so its rows must score as mixreg em's.
    runs: dict[str, list[dict[str, Any]]] = {}
    for case in (movielens_style(n_users=40), segments(n_groups=60)):
        fit = fit_mixreg(case, "em", seed=0)
        runs[case.name] = [
            {
                "seed": 0,
                "status": "ok",
                "message": "",
                "seconds": 9.0,
                "cpu_seconds": 8.0,
                "log_likelihood": 0.0,
                "n_components": case.n_components,
                "prior": fit.prior.tolist(),
                "intercept": fit.intercept.tolist(),
                "coef": fit.coef.tolist(),
                "sigma": fit.sigma.tolist(),
            }
        ]
    cached = tmp_path / "runs.json"
    cached.write_text(json.dumps(runs))
    results = tmp_path / "RESULTS.md"
    argv = ["--seeds", "1", "--scale", "0.1", "--reuse-r", "--rscript", "no-such-rscript"]
    assert main([*argv, "--runs", str(cached), "--results", str(results)]) == 0
    report = results.read_text()
    assert "<!-- peers-grouped:start -->" in report and "<!-- peers-grouped:end -->" in report
    table = [line.split(" | ") for line in report.splitlines() if line.startswith("| ")]
    by_method = {(row[0], row[1]): row for row in table if len(row) == 7}
    for case_name in runs:
        ours = by_method[(f"| {case_name}", "mixreg em")]
        theirs = by_method[(f"| {case_name}", "flexmix")]
        # The same lines, noise and priors: the same likelihoods, min-loss and shares.
        assert ours[2:6] == theirs[2:6]
        assert theirs[6].startswith("8.00 (9.00)")
