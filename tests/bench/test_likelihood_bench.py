"""The Python side of the likelihood benchmark: pass rules, matching, sweep checks, the saved
runs and the section built from them.

Nothing here runs R or fits a mixture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.likelihood import (
    SE_AGREEMENT,
    agreeing_se_differences,
    annotate_refit_point,
    build_section,
    flexmix_lines,
    flexmix_standard_errors,
    largest_se_difference,
    main,
    maxima_agree,
    no_repeated_values,
    panel_in_raw_units,
    passes,
    picked_true_k,
    price_like,
    refit_log_likelihood,
    refit_point,
    se_verdict,
    set_verdict,
    sets_table,
    standard_errors_at,
    sweep_summary,
    update_runs,
)


def set_row(
    mixreg: float, flexmix: float, kept: int = 3, se: float | None = 0.01
) -> dict[str, Any]:
    return {
        "name": "a set",
        "n": 200,
        "k": 3,
        "mixreg_log_likelihood": mixreg,
        "mixreg_seconds": 1.0,
        "ml_start": "em restart",
        "flexmix_log_likelihood": flexmix,
        "flexmix_kept": kept,
        "flexmix_seconds": 2.0,
        "se_difference": se,
    }


def sweep(
    log_likelihood: list[float], bic: list[float], chosen: int, em_bic: list[float] | None = None
) -> dict[str, Any]:
    ks = list(range(1, len(bic) + 1))
    result: dict[str, Any] = {
        "name": "a sweep",
        "ks": ks,
        "mixreg_log_likelihood": log_likelihood,
        "mixreg_bic": bic,
        "mixreg_start": ["min-loss lines"] * len(ks),
        "mixreg_chosen_k": chosen,
        "mixreg_seconds": 1.0,
        "flexmix_log_likelihood": log_likelihood,
        "flexmix_bic": bic,
        "flexmix_kept": ks,
        "flexmix_seconds": 1.0,
    }
    if em_bic is not None:
        result["em_bic"] = em_bic
        result["em_log_likelihood"] = log_likelihood
    return result


def test_pass_allows_a_hundredth_below_flexmix_and_no_more() -> None:
    assert passes(-451.70, -451.70)
    assert passes(-451.709, -451.70)
    assert not passes(-451.72, -451.70)
    assert passes(-440.0, -451.70)


def test_maxima_agree_needs_k_kept_lines_and_close_likelihoods() -> None:
    assert maxima_agree(-451.700, -451.705, 3, 3)
    assert not maxima_agree(-451.70, -451.72, 3, 3)
    # Far above flexmix is another maximum too: its standard errors are of other lines.
    assert not maxima_agree(-440.0, -451.70, 3, 3)
    assert not maxima_agree(-451.70, -451.70, 2, 3)


def test_standard_errors_are_compared_line_by_line_after_the_hungarian_match() -> None:
    ours = np.array([[1.0, 0.0], [-2.0, 5.0], [4.0, -3.0]])
    ours_se = np.array([[0.10, 0.20], [0.30, 0.40], [0.50, 0.60]])
    order = [2, 0, 1]
    theirs, theirs_se = ours[order] + 1e-3, ours_se[order].copy()
    assert largest_se_difference(ours, ours_se, theirs, theirs_se) == 0.0
    theirs_se[0, 1] = 0.6 / 1.05  # flexmix's line 0 is mixreg's line 2
    assert abs(largest_se_difference(ours, ours_se, theirs, theirs_se) - 0.05) < 1e-12


def test_flexmix_output_is_read_with_r_unboxing_undone() -> None:
    # jsonlite's auto_unbox writes one line (and one slope) as bare numbers.
    one = {"intercept": 2.5, "coef": [[3.0]], "intercept_se": 0.1, "coef_se": [[0.2]]}
    assert np.array_equal(flexmix_lines(one, 1), [[3.0, 2.5]])
    errors = flexmix_standard_errors(one, 1)
    assert errors is not None and np.array_equal(errors, [[0.2, 0.1]])
    two = {"intercept": [1.0, 2.0], "coef": [[3.0, 4.0], [5.0, 6.0]]}
    assert np.array_equal(flexmix_lines(two, 2), [[3.0, 4.0, 1.0], [5.0, 6.0, 2.0]])
    assert flexmix_standard_errors(two, 2) is None


def test_the_sets_table_marks_a_set_below_flexmix_and_judges_ses_only_at_one_maximum() -> None:
    rows = [
        set_row(-451.69, -451.70, se=0.004),
        set_row(-459.48, -451.70, se=0.32),
        set_row(-451.68, -451.70, se=0.015),
        set_row(-451.70, -451.70, se=SE_AGREEMENT + 0.01),
    ]
    header, table = sets_table(rows)
    passed = [line[header.index("pass")] for line in table]
    verdicts = [line[header.index("SE pass")] for line in table]
    assert passed == ["yes", "**no**", "yes", "yes"]
    assert verdicts == ["yes", "n/a (other maximum)", "n/a (other maximum)", "**no**"]
    assert agreeing_se_differences(rows) == [0.004, SE_AGREEMENT + 0.01]
    assert agreeing_se_differences(rows, 0.05) == [0.004, 0.015, SE_AGREEMENT + 0.01]
    assert se_verdict(set_row(-1.0, -1.0, se=None)) == "n/a (no refit SEs)"


def test_refit_point_reads_flexmixs_names_and_its_log_likelihood_is_the_mixtures() -> None:
    # Two lines in one feature: intercepts 1 and -2, slopes 3 and 0.5, sigma 0.5 and 2, the
    # second line's logit log(3) against the first (priors 1/4 and 3/4).
    coef = {
        "model.1_Comp.1_coef.(Intercept)": 1.0,
        "model.1_Comp.1_coef.x1": 3.0,
        "model.1_Comp.1_log(sigma)": np.log(0.5),
        "model.1_Comp.2_coef.(Intercept)": -2.0,
        "model.1_Comp.2_coef.x1": 0.5,
        "model.1_Comp.2_log(sigma)": np.log(2.0),
        "concomitant_Comp.2.alpha": np.log(3.0),
    }
    point = refit_point({"n_kept": 2, "refit_coef": coef}, 1)
    assert point is not None
    assert np.allclose(point.theta, [[3.0, 1.0], [0.5, -2.0]])
    assert np.allclose(point.weights, [0.25, 0.75])
    assert np.allclose(point.variances, [0.25, 4.0])
    assert refit_point({"n_kept": 2}, 1) is None
    X, y = np.array([[0.0], [1.0]]), np.array([1.0, 0.0])
    # By hand: each row's density is the two normal densities weighted by the priors.
    normal = lambda r, s: np.exp(-0.5 * (r / s) ** 2) / (s * np.sqrt(2 * np.pi))  # noqa: E731
    by_hand = np.log(0.25 * normal(0.0, 0.5) + 0.75 * normal(3.0, 2.0)) + np.log(
        0.25 * normal(-4.0, 0.5) + 0.75 * normal(1.5, 2.0)
    )
    assert np.isclose(refit_log_likelihood(X, y, point), by_hand)


def test_standard_errors_are_judged_at_refits_point_when_it_is_known() -> None:
    # flexmix's EM stopped 0.03 short, refit() optimized on to mixreg's maximum: one maximum.
    row = {**set_row(-451.69, -451.72, se=0.004), "flexmix_refit_log_likelihood": -451.695}
    assert se_verdict(row) == "yes"
    assert agreeing_se_differences([row]) == [0.004]
    header, table = sets_table([row])
    assert table[0][header.index("refit() log-lik")] == "-451.69"  # -451.695 to 2 places
    far = {**row, "flexmix_refit_log_likelihood": -451.72}
    assert se_verdict(far) == "n/a (other maximum)"


def test_a_flexmix_maximum_with_a_line_of_too_few_rows_is_marked_not_failed() -> None:
    # One feature: 2 coefficients, so a proper line owns at least 5 rows.
    row = {**set_row(-53.71, -49.71), "flexmix_fit": {"coef": [[0.07], [0.31]]}}
    assert set_verdict(row) == "**no**"
    assert (
        set_verdict({**row, "flexmix_smallest_rows": 2.9})
        == "flexmix spurious (a line of 2.9 rows)"
    )
    assert set_verdict({**row, "flexmix_smallest_rows": 5.0}) == "**no**"
    assert set_verdict({**row, "mixreg_log_likelihood": -49.70}) == "yes"


def test_refit_point_annotation_compares_standard_errors_at_one_point() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(120, 1))
    owner = rng.integers(0, 2, size=120)
    y = np.where(owner == 0, 1.0 + 3.0 * X[:, 0], -2.0 + 0.5 * X[:, 0]) + rng.normal(size=120)
    coef = {
        "model.1_Comp.1_coef.(Intercept)": 1.0,
        "model.1_Comp.1_coef.x1": 3.0,
        "model.1_Comp.1_log(sigma)": 0.0,
        "model.1_Comp.2_coef.(Intercept)": -2.0,
        "model.1_Comp.2_coef.x1": 0.5,
        "model.1_Comp.2_log(sigma)": 0.0,
        "concomitant_Comp.2.alpha": 0.0,
    }
    fit: dict[str, Any] = {"n_kept": 2, "refit_coef": coef, "prior": [0.5, 0.5]}
    point = refit_point(fit, 1)
    assert point is not None
    ours = standard_errors_at(X, y, point)
    assert ours is not None and ours.shape == (2, 2) and np.all(ours > 0)
    # refit()'s standard errors 1 % above mixreg's at the same point.
    fit["coef_se"] = [[value] for value in 1.01 * ours[:, 0]]
    fit["intercept_se"] = list(1.01 * ours[:, 1])
    row = annotate_refit_point({**set_row(-1.0, -1.0), "flexmix_fit": fit}, X, y)
    assert abs(row["se_at_refit_point_difference"] - (1 - 1 / 1.01)) < 1e-12
    assert row["flexmix_smallest_rows"] == 60.0
    assert row["flexmix_refit_log_likelihood"] == refit_log_likelihood(X, y, point)
    header, table = sets_table([row])
    assert table[0][header.index("SEs at refit()'s point")] == "0.990 %"


def test_a_copied_score_is_two_equal_values_in_a_row() -> None:
    assert no_repeated_values([-900.0, -850.0, -840.0, -841.0])
    assert not no_repeated_values([-900.0, -850.0, -840.0, -840.0])
    # A fit at k that found nothing beyond k - 1's maximum is the same value too.
    assert not no_repeated_values([-900.0, -850.0, -840.0, -840.0 + 1e-7])
    summary = sweep_summary(sweep([-900.0, -850.0, -850.0], [1810.0, 1720.0, 1730.0], 2))
    assert not summary["distinct"]


def test_the_chosen_k_must_have_the_lowest_bic_of_every_mixreg_fit() -> None:
    log_likelihood = [-900.0, -850.0, -840.0, -835.0]
    bic = [1810.0, 1720.0, 1715.0, 1718.0]
    summary = sweep_summary(sweep(log_likelihood, bic, 3, em_bic=[1810.0, 1720.0, 1715.01, 1716.0]))
    assert summary["lowest"] and summary["chosen"] == 3 and summary["flexmix_chosen"] == 3
    # em n_init=10 found a better fit at k = 4 than the sweep's choice.
    summary = sweep_summary(sweep(log_likelihood, bic, 3, em_bic=[1810.0, 1720.0, 1716.0, 1700.0]))
    assert not summary["lowest"] and summary["lowest_bic"] == 1700.0
    assert summary["lowest_k"] == 4
    # The right k, but em n_init=10 reached a higher maximum at it than the sweep.
    summary = sweep_summary(sweep(log_likelihood, bic, 3, em_bic=[1810.0, 1720.0, 1700.0, 1716.0]))
    assert summary["lowest_k"] == 3 and not summary["lowest"]


def test_realizable_counts_and_section() -> None:
    runs = [
        {
            "true_k": 2,
            "seed": seed,
            "chosen_k": 2,
            "seconds": 1.0,
            "log_likelihood": [-900.0, -800.0, -800.0 + 1e-8, -799.5],
        }
        for seed in range(10)
    ] + [
        {
            "true_k": 3,
            "seed": seed,
            "chosen_k": 3 if seed else 2,
            "seconds": 2.0,
            "log_likelihood": [-900.0, -800.0, -700.0, -700.0, -700.0],
        }
        for seed in range(5)
    ]
    runs[10 + 1]["chosen_k"] = 4
    assert picked_true_k(runs, 2) == (10, 10)
    assert picked_true_k(runs, 3) == (3, 5)
    report = build_section({"realizable": runs}, ["- machine"])
    text = "\n".join(report.lines)
    assert "| 2 | 10 / 10 | - | 0.5 | 1.0 |" in text
    assert "| 3 | 3 / 5 | seed 0: k = 2, seed 1: k = 4 | 0 | 2.0 |" in text
    assert "seeds per true k as in the table" in text
    assert [met for *_, met in report.targets] == [True, False]


def test_parts_merge_into_the_saved_runs(tmp_path: Path) -> None:
    runs = tmp_path / "runs.json"
    first = [{"true_k": k, "seed": 0, "chosen_k": k, "seconds": 1.0} for k in (2, 3)]
    update_runs(runs, {"realizable": first, "parts": {"a": {"minutes": 1.0}}})
    again = [{"true_k": 3, "seed": seed, "chosen_k": 3, "seconds": 1.0} for seed in (0, 1)]
    record = update_runs(runs, {"realizable": again, "parts": {"b": {"minutes": 2.0}}})
    assert [(run["true_k"], run["seed"]) for run in record["realizable"]] == [
        (2, 0),
        (3, 0),
        (3, 1),
    ]
    assert set(record["parts"]) == {"a", "b"}
    assert json.loads(runs.read_text()) == record


def test_summary_only_writes_the_section_from_the_saved_runs(tmp_path: Path) -> None:
    runs, output = tmp_path / "runs.json", tmp_path / "RESULTS.md"
    output.write_text("# Results\n\n<!-- peers:start -->\nkept\n<!-- peers:end -->\n")
    record = {
        "head": ["- Command: `python -m bench.likelihood`"],
        "sets": [set_row(-459.48, -451.70, se=None)],
        "sweeps": [sweep([-900.0, -850.0, -840.0], [1810.0, 1720.0, 1715.0], 3)],
        "parts": {
            "sets": {
                "command": "python -m bench.likelihood --parts sets",
                "date": "2026-01-01 00:00 UTC",
                "load_start": "1.00, 1.00, 1.00",
                "load_end": "2.00, 1.00, 1.00",
                "minutes": 3.0,
            }
        },
    }
    runs.write_text(json.dumps(record))
    main(["--summary-only", "--runs", str(runs), "--output", str(output)])
    text = output.read_text()
    assert "<!-- peers:start -->\nkept\n<!-- peers:end -->" in text
    section = text[text.index("<!-- likelihood:start -->") : text.index("<!-- likelihood:end -->")]
    assert "## Likelihood" in section and "### Sweep BIC curves" in section
    assert "| log-likelihood >= flexmix's - 0.01, every set | 1 of 1 | 0 of 1 (below: a set) |" in (
        section
    )
    assert "| sets | `python -m bench.likelihood --parts sets` |" in section
    # No set where the maxima agree: the SE target says so and is not met.
    assert "no set: refit()'s point is never within 0.01 of mixreg's | **no** |" in section


def test_the_real_like_sets_are_in_raw_units() -> None:
    X, y = price_like(n_samples=2000)
    assert X.shape == (2000, 3)
    # Offsets and scales far apart: carat ~1, depth ~62, table ~57; prices in thousands.
    assert 0.5 < X[:, 0].mean() < 1.5 and 55 < X[:, 1].mean() < 65 and 50 < X[:, 2].mean() < 65
    assert X[:, 0].std() < 1 < X[:, 1].std() and np.abs(y).mean() > 1000
    X, y = panel_in_raw_units()
    assert X.shape == (176, 3) and y.shape == (176,)
    assert X[:, 2].min() > 2000 and X[:, 2].max() - X[:, 2].min() == 10
