"""The likelihood behind standard errors, BIC and the chosen k, beside flexmix's.

``python -m bench.likelihood`` (``make bench-likelihood``) writes the section "Likelihood" of
``bench/RESULTS.md``, in three parts (``--parts``):

- ``sets``: on every small real set of the R-peer benchmark (its training split and its k's),
  flexmix's ``NregFix`` (``y ~ x1 + x2`` and ``y ~ x1 + x2 + w``, k = 3) and two real-like sets
  drawn here (:func:`price_like`, 40,000 rows, k = 4; :func:`panel_in_raw_units`, 176 rows,
  k = 3): the default fit's ``log_likelihood_`` with ``standard_errors=True`` (seed 0) beside
  flexmix's ``stepFlexmix(y ~ ., k = k, nrep = 10)`` (``set.seed(0)``), and where the two
  maxima agree, mixreg's standard errors beside ``refit()``'s of flexmix's own fit;
- ``sweeps``: the BIC curve of ``mixreg.select_n_components`` beside that of
  ``stepFlexmix(k = 1:K, nrep = 10)`` on NregFix (``y ~ x1 + x2``), the panel and the price-like
  set; on the price-like set also ``algorithm="em", n_init=10`` fits at every k, scored by
  ``mixreg.mixture_score``;
- ``realizable``: k sweeps on ``mixreg.datasets.make_realizable`` rows (true k = 2..8): how many
  seeds pick the true k.

Every part's results are saved to ``bench/likelihood_runs.json`` (``--runs``): a run of some
parts keeps the others' saved results, and the section is built from the whole file
(``--summary-only`` rebuilds it without fitting anything).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import itertools
import json
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

import mixreg
from bench.peers import r_unavailable_reason, r_versions, write_training_csv
from bench.real_data import (
    R_DATASETS,
    R_SCRIPTS,
    RealData,
    export_r_datasets,
    load_diabetes_data,
    load_r_dataset,
    split_train_test,
)
from bench.sections import Report, load_average, log, machine_lines, write_section
from bench.standard_errors import EXPORT_R_DATA
from mixreg import MixtureOfLinearRegressions
from mixreg._inference import (
    MixtureParameters,
    covariance_from_information,
    log_likelihood,
    match_lines,
    observed_information,
)
from mixreg._likelihood import MIN_RESIDUAL_ROWS
from mixreg.datasets import make_realizable

FloatArray = NDArray[np.float64]

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "bench" / "RESULTS.md"
RUNS = REPO_ROOT / "bench" / "likelihood_runs.json"
SECTION = "likelihood"
R_SCRIPT = R_SCRIPTS / "likelihood.R"
PARTS = ("sets", "sweeps", "realizable", "refit-points")
N_STARTS = 10
SEED = 0
LIKELIHOOD_SLACK = 0.01
"""mixreg's log-likelihood passes at flexmix's minus this; the maxima agree within it."""
SE_AGREEMENT = 0.02
SAME_VALUE = 1e-3
"""Two log-likelihoods closer than this are one value (the tables show two decimals)."""
NEAR_MAXIMUM = 0.05
"""flexmix's EM stops at a relative tolerance: a fit this far below mixreg's can be the same
maximum stopped short; its standard errors are shown beside the strict comparison."""
PRICE_ROWS = 40_000
PANEL_FIRMS, PANEL_YEARS = 16, 11
REALIZABLE_TRUE_K = tuple(range(2, 9))
REALIZABLE_ROWS = 10_000
REALIZABLE_FEATURES = 3
REALIZABLE_NOISE = 0.1
REALIZABLE_TARGET = 0.9


@dataclass(frozen=True)
class DataSet:
    """Rows to fit and the numbers of lines to fit them with."""

    name: str
    X: FloatArray
    y: FloatArray
    n_components: tuple[int, ...]


# --------------------------------------------------------------------------- data


def price_like(n_samples: int = PRICE_ROWS, seed: int = 0) -> tuple[FloatArray, FloatArray]:
    """Rows like a price list: carat (~0.2-3), depth (~62 %) and table (~57 %) to a price in
    dollars, from four segments with their own lines, noise growing with the carat.

    The features have large offsets and scales three orders of magnitude apart, and the
    target is in the thousands: the kind of raw units that trouble a fit without scaling.
    """
    rng = np.random.default_rng(seed)
    carat = np.clip(rng.lognormal(np.log(0.7), 0.55, n_samples), 0.2, 5.0)
    depth = rng.normal(61.7, 1.4, n_samples)
    table = rng.normal(57.4, 2.2, n_samples)
    segment = rng.choice(4, size=n_samples, p=[0.4, 0.3, 0.2, 0.1])
    intercept = np.array([-2300.0, 1500.0, -5200.0, 900.0])
    slope = np.array(
        [
            [7800.0, 25.0, -30.0],
            [5200.0, -40.0, 10.0],
            [11500.0, 60.0, -15.0],
            [3000.0, -10.0, 45.0],
        ]
    )
    noise = np.array([300.0, 450.0, 700.0, 250.0])
    X = np.column_stack([carat, depth, table])
    y = (
        intercept[segment]
        + np.einsum("ij,ij->i", X, slope[segment])
        + noise[segment] * (0.4 + carat) * rng.standard_normal(n_samples)
    )
    return X, y


def panel_in_raw_units(
    n_firms: int = PANEL_FIRMS, n_years: int = PANEL_YEARS, seed: int = 0
) -> tuple[FloatArray, FloatArray]:
    """A small panel of firms over years in raw units: capital (thousands of dollars), labour
    (employees) and the calendar year to output (thousands of dollars), three technologies.

    The year is a feature with an offset of 2,000 and a spread of a few units.
    """
    rng = np.random.default_rng(seed)
    technology = rng.integers(0, 3, size=n_firms)
    size = rng.lognormal(0.0, 0.5, n_firms)
    firm = np.repeat(np.arange(n_firms), n_years)
    year = np.tile(np.arange(2005.0, 2005.0 + n_years), n_firms)
    capital = 800.0 * size[firm] * rng.lognormal(0.0, 0.15, firm.size)
    labour = 120.0 * size[firm] * rng.lognormal(0.0, 0.2, firm.size)
    intercept = np.array([-90_000.0, 140_000.0, -20_000.0])
    slope = np.array([[1.8, 9.0, 45.0], [0.9, 22.0, -70.0], [2.6, 3.0, 10.0]])
    noise = np.array([150.0, 300.0, 220.0])
    X = np.column_stack([capital, labour, year])
    lines = technology[firm]
    y = (
        intercept[lines]
        + np.einsum("ij,ij->i", X, slope[lines])
        + noise[lines] * rng.standard_normal(firm.size)
    )
    return X, y


def real_sets() -> list[DataSet]:
    """The small real sets of the R-peer benchmark: training split, the k's fitted there."""
    export_r_datasets(R_DATASETS)
    data: list[RealData] = [load_r_dataset(spec) for spec in R_DATASETS]
    data.append(load_diabetes_data())
    sets = []
    for item in data:
        X_train, y_train, _, _ = split_train_test(item.X, item.y)
        sets.append(DataSet(f"{item.spec.title} (train)", X_train, y_train, item.spec.n_components))
    return sets


def nregfix(folder: Path) -> tuple[FloatArray, FloatArray, FloatArray]:
    """flexmix's NregFix (exported as ``bench.standard_errors`` does): y, (x1, x2) and w."""
    subprocess.run(["Rscript", "-e", EXPORT_R_DATA, str(folder)], check=True)
    table = np.genfromtxt(folder / "nregfix.csv", delimiter=",", skip_header=1)
    return table[:, 0], table[:, 1:3], table[:, 3]


def all_sets(folder: Path) -> tuple[list[DataSet], dict[str, DataSet]]:
    """The per-set part's sets, and the sweep part's (name to set, with its largest k)."""
    y, X12, w = nregfix(folder)
    price_X, price_y = price_like()
    panel_X, panel_y = panel_in_raw_units()
    nreg = DataSet("NregFix, y ~ x1 + x2", X12, y, (3,))
    panel = DataSet(
        f"panel in raw units ({PANEL_FIRMS * PANEL_YEARS} rows, 3 features)", panel_X, panel_y, (3,)
    )
    price = DataSet(f"price-like ({PRICE_ROWS:,} rows, 3 features)", price_X, price_y, (4,))
    sets = [
        *real_sets(),
        nreg,
        DataSet("NregFix, y ~ x1 + x2 + w", np.column_stack([X12, w]), y, (3,)),
        panel,
        price,
    ]
    sweeps = {
        nreg.name: DataSet(nreg.name, nreg.X, nreg.y, (6,)),
        panel.name: DataSet(panel.name, panel.X, panel.y, (8,)),
        price.name: DataSet(price.name, price.X, price.y, (8,)),
    }
    return sets, sweeps


# --------------------------------------------------------------------------- flexmix


class FlexmixRun:
    """``bench/peers_r/likelihood.R`` on some rows, running in the background: one fit at k
    (``mode="fit"``) or a sweep over 1..k (``mode="sweep"``); :meth:`result` waits for it.

    flexmix's sweeps on tens of thousands of rows take minutes: they run while mixreg fits.
    """

    def __init__(
        self,
        X: FloatArray,
        y: FloatArray,
        mode: str,
        k: int,
        n_starts: int = N_STARTS,
        seed: int = SEED,
    ) -> None:
        self.label = f"{mode} k={k}"
        self._scratch = tempfile.TemporaryDirectory()
        scratch = Path(self._scratch.name)
        train, self._output = scratch / "train.csv", scratch / "out.json"
        write_training_csv(train, X, y)
        arguments = [str(train), mode, str(k), str(n_starts), str(seed), str(self._output)]
        self._process = subprocess.Popen(
            ["Rscript", str(R_SCRIPT), *arguments],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def result(self) -> dict[str, Any]:
        """The script's output (RuntimeError with R's last lines if it failed)."""
        _, stderr = self._process.communicate()
        try:
            if self._process.returncode != 0:
                last_lines = " ".join(stderr.strip().splitlines()[-3:])
                raise RuntimeError(f"Rscript likelihood.R {self.label} failed: {last_lines}")
            result: dict[str, Any] = json.loads(self._output.read_text())
        finally:
            self._scratch.cleanup()
        return result


def flexmix_lines(fit: dict[str, Any], n_features: int) -> FloatArray:
    """Per kept component its slopes then its intercept (``auto_unbox`` undone)."""
    intercept = np.atleast_1d(np.asarray(fit["intercept"], dtype=np.float64))
    coef = np.asarray(fit["coef"], dtype=np.float64).reshape(intercept.size, n_features)
    return np.column_stack([coef, intercept])


def flexmix_standard_errors(fit: dict[str, Any], n_features: int) -> FloatArray | None:
    """refit()'s standard errors per component (slopes then intercept), if it made them."""
    if "intercept_se" not in fit:
        return None
    intercept = np.atleast_1d(np.asarray(fit["intercept_se"], dtype=np.float64))
    coef = np.asarray(fit["coef_se"], dtype=np.float64).reshape(intercept.size, n_features)
    return np.column_stack([coef, intercept])


def refit_point(fit: dict[str, Any], n_features: int) -> MixtureParameters | None:
    """The mixture at which flexmix's ``refit()`` took its standard errors (it optimizes on
    from the EM fit), in raw units: per line its slopes then intercept; None when refit() did
    not run."""
    coef = fit.get("refit_coef")
    if not coef:
        return None
    k = int(fit["n_kept"])
    theta = np.empty((k, n_features + 1))
    log_sigma = np.empty(k)
    logits = np.zeros(k)
    for j in range(1, k + 1):
        prefix = f"model.1_Comp.{j}_"
        theta[j - 1, -1] = coef[prefix + "coef.(Intercept)"]
        theta[j - 1, :-1] = [coef[f"{prefix}coef.x{i}"] for i in range(1, n_features + 1)]
        log_sigma[j - 1] = coef[prefix + "log(sigma)"]
        if j > 1:
            logits[j - 1] = coef[f"concomitant_Comp.{j}.alpha"]
    weights = np.exp(logits - logits.max())
    return MixtureParameters(
        theta=theta, weights=weights / weights.sum(), variances=np.exp(2.0 * log_sigma)
    )


def refit_log_likelihood(X: FloatArray, y: FloatArray, point: MixtureParameters) -> float:
    """The log-likelihood of the rows at ``point`` (raw units, intercept column last)."""
    Z = np.column_stack([X, np.ones(len(y))])
    return float(log_likelihood(Z, y, point))


def standard_errors_at(X: FloatArray, y: FloatArray, point: MixtureParameters) -> FloatArray | None:
    """mixreg's standard errors of the lines (per line its slopes then intercept) at ``point``,
    from the observed information in raw units; None where it is singular."""
    Z = np.column_stack([X, np.ones(len(y))])
    covariance = covariance_from_information(observed_information(Z, y, point))
    if covariance is None:
        return None
    k, n_line = point.n_components, X.shape[1] + 2
    se = np.sqrt(np.maximum(np.diag(covariance), 0.0))[: k * n_line]
    return se.reshape(k, n_line)[:, :-1]


def annotate_refit_point(row: dict[str, Any], X: FloatArray, y: FloatArray) -> dict[str, Any]:
    """``row`` with what the fit of flexmix it holds says at refit()'s point: its
    log-likelihood, mixreg's standard errors there against refit()'s (one point, so the
    computation alone is compared), and flexmix's smallest line in rows (weight times rows)."""
    flexmix, n_features = row["flexmix_fit"], X.shape[1]
    priors = np.atleast_1d(np.asarray(flexmix["prior"], dtype=np.float64))
    row = {**row, "flexmix_smallest_rows": float(priors.min() * len(y))}
    point = refit_point(flexmix, n_features)
    theirs = flexmix_standard_errors(flexmix, n_features)
    if point is None:
        return row
    row["flexmix_refit_log_likelihood"] = refit_log_likelihood(X, y, point)
    ours = standard_errors_at(X, y, point)
    if ours is not None and theirs is not None:
        row["se_at_refit_point_difference"] = float(np.max(np.abs(ours / theirs - 1.0)))
    return row


# --------------------------------------------------------------------------- pure parts


def passes(mixreg_log_likelihood: float, flexmix_log_likelihood: float) -> bool:
    """Whether mixreg's maximum is at least flexmix's less :data:`LIKELIHOOD_SLACK`."""
    return mixreg_log_likelihood >= flexmix_log_likelihood - LIKELIHOOD_SLACK


def flexmix_spurious(row: dict[str, Any]) -> bool:
    """Whether flexmix's maximum is one mixreg does not keep: a line owning fewer rows than
    its coefficients (slopes and intercept) plus :data:`MIN_RESIDUAL_ROWS`."""
    smallest = row.get("flexmix_smallest_rows")
    n_coefficients = len(np.atleast_1d(row["flexmix_fit"]["coef"][0])) + 1 if smallest else 0
    return smallest is not None and smallest < n_coefficients + MIN_RESIDUAL_ROWS


def set_verdict(row: dict[str, Any]) -> str:
    """The pass cell: above flexmix less the slack, or flexmix at a maximum mixreg calls
    spurious (said so)."""
    if passes(row["mixreg_log_likelihood"], row["flexmix_log_likelihood"]):
        return "yes"
    if flexmix_spurious(row):
        return f"flexmix spurious (a line of {row['flexmix_smallest_rows']:.1f} rows)"
    return "**no**"


def maxima_agree(
    mixreg_log_likelihood: float, flexmix_log_likelihood: float, n_kept: int, k: int
) -> bool:
    """Whether the two fits are of one maximum: flexmix kept k lines, likelihoods within
    :data:`LIKELIHOOD_SLACK`."""
    return n_kept == k and abs(mixreg_log_likelihood - flexmix_log_likelihood) < LIKELIHOOD_SLACK


def se_point_log_likelihood(row: dict[str, Any]) -> float:
    """The log-likelihood where flexmix's standard errors were taken: refit()'s point when it
    is known, else the EM fit's."""
    refit = row.get("flexmix_refit_log_likelihood")
    return row["flexmix_log_likelihood"] if refit is None else refit


def largest_se_difference(
    ours: FloatArray, ours_se: FloatArray, theirs: FloatArray, theirs_se: FloatArray
) -> float:
    """The largest ``|ours_se / theirs_se - 1|`` over the coefficients and intercepts, lines
    matched by the Hungarian assignment on (coefficients, intercept) as in
    ``bench.standard_errors``."""
    order = match_lines(ours, theirs)
    return float(np.max(np.abs(ours_se / theirs_se[order] - 1.0)))


def no_repeated_values(values: Sequence[float], tolerance: float = SAME_VALUE) -> bool:
    """Whether no two neighbours of ``values`` are within ``tolerance`` (a copied score, or a
    fit at k that found nothing beyond k - 1's maximum, would be)."""
    return all(abs(a - b) > tolerance for a, b in itertools.pairwise(values))


def gains_beyond(log_likelihood: Sequence[float], true_k: int) -> float:
    """The largest gain of a sweep's k > ``true_k`` over ``true_k``'s log-likelihood (the
    sweep's k's are 1, 2, ...)."""
    return max(value - log_likelihood[true_k - 1] for value in log_likelihood[true_k:])


def lowest_bic_k(bics: Sequence[float], ks: Sequence[int]) -> int:
    """The k of the lowest BIC (ties to the smaller k)."""
    return int(ks[int(np.argmin(np.asarray(bics)))])


def picked_true_k(runs: Sequence[dict[str, Any]], true_k: int) -> tuple[int, int]:
    """How many of the runs of ``true_k`` chose it, out of how many."""
    mine = [run for run in runs if run["true_k"] == true_k]
    return sum(run["chosen_k"] == true_k for run in mine), len(mine)


def format_value(value: float | None, digits: int = 2) -> str:
    """A number for the tables; ``None`` (not measured) as a dash."""
    return "-" if value is None else f"{value:,.{digits}f}"


def se_verdict(row: dict[str, Any]) -> str:
    """The SE pass cell: judged only where the two maxima agree."""
    se = row.get("se_difference")
    if not maxima_agree(
        row["mixreg_log_likelihood"], se_point_log_likelihood(row), row["flexmix_kept"], row["k"]
    ):
        return "n/a (other maximum)"
    if se is None:
        return "n/a (no refit SEs)"
    return "yes" if se <= SE_AGREEMENT else "**no**"


def agreeing_se_differences(
    rows: Sequence[dict[str, Any]], slack: float = LIKELIHOOD_SLACK
) -> list[float]:
    """The SE differences of the sets where flexmix kept k lines and the two log-likelihoods
    are within ``slack``."""
    return [
        row["se_difference"]
        for row in rows
        if row.get("se_difference") is not None
        and row["flexmix_kept"] == row["k"]
        and abs(row["mixreg_log_likelihood"] - se_point_log_likelihood(row)) < slack
    ]


def sets_table(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-set table."""
    header = [
        "set",
        "n",
        "k",
        "mixreg log-lik",
        "mixreg s",
        "ml_start_",
        "flexmix log-lik",
        "kept",
        "flexmix s",
        "mixreg - flexmix",
        "pass",
        "refit() log-lik",
        "max SE rel. diff",
        "SE pass",
        "SEs at refit()'s point",
    ]
    table = []
    for row in rows:
        difference = row["mixreg_log_likelihood"] - row["flexmix_log_likelihood"]
        se = row.get("se_difference")
        at_point = row.get("se_at_refit_point_difference")
        table.append(
            [
                row["name"],
                f"{row['n']:,}",
                str(row["k"]),
                format_value(row["mixreg_log_likelihood"]),
                format_value(row["mixreg_seconds"], 1),
                row["ml_start"],
                format_value(row["flexmix_log_likelihood"]),
                str(row["flexmix_kept"]),
                format_value(row["flexmix_seconds"], 1),
                f"{difference:+.3f}",
                set_verdict(row),
                format_value(row.get("flexmix_refit_log_likelihood")),
                "-" if se is None else f"{100 * se:.2f} %",
                se_verdict(row),
                "-" if at_point is None else f"{100 * at_point:.3f} %",
            ]
        )
    return header, table


def sweep_table(sweep: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one sweep's table: per k mixreg's and flexmix's fits (and the em
    fits' when measured)."""
    with_em = "em_bic" in sweep
    header = [
        "k",
        "mixreg log-lik",
        "mixreg BIC",
        "start",
        "flexmix log-lik",
        "flexmix BIC",
        "flexmix kept",
    ]
    if with_em:
        header += ["em n_init=10 log-lik", "em n_init=10 BIC"]
    rows = []
    for position, k in enumerate(sweep["ks"]):
        row = [
            str(k),
            format_value(sweep["mixreg_log_likelihood"][position]),
            format_value(sweep["mixreg_bic"][position]),
            sweep["mixreg_start"][position],
            format_value(sweep["flexmix_log_likelihood"][position]),
            format_value(sweep["flexmix_bic"][position]),
            str(sweep["flexmix_kept"][position]),
        ]
        if with_em:
            row += [
                format_value(sweep["em_log_likelihood"][position]),
                format_value(sweep["em_bic"][position]),
            ]
        rows.append(row)
    return header, rows


def sweep_summary(sweep: dict[str, Any]) -> dict[str, Any]:
    """What a sweep shows: its choices, no copied scores, and whether its chosen k has the
    lowest BIC of every mixreg fit measured (the sweep's and the em fits'), within twice
    :data:`LIKELIHOOD_SLACK` (one maximum reached from two starts differs in the last digits)."""
    ks = sweep["ks"]
    chosen = sweep["mixreg_chosen_k"]
    chosen_bic = sweep["mixreg_bic"][ks.index(chosen)]
    all_bics = list(sweep["mixreg_bic"]) + list(sweep.get("em_bic", []))
    # The k of the lowest BIC of every fit (the sweep's and the em fits', k by k).
    best_at_k = [
        min(bics)
        for bics in zip(sweep["mixreg_bic"], sweep.get("em_bic", sweep["mixreg_bic"]), strict=True)
    ]
    return {
        "chosen": chosen,
        "flexmix_chosen": lowest_bic_k(sweep["flexmix_bic"], ks),
        "distinct": no_repeated_values(sweep["mixreg_log_likelihood"]),
        "lowest_k": lowest_bic_k(best_at_k, ks),
        "lowest": chosen_bic <= min(all_bics) + 2 * LIKELIHOOD_SLACK,
        "lowest_bic": min(all_bics),
    }


def build_section(record: dict[str, Any], head: Sequence[str]) -> Report:
    """The section's Markdown from the saved results (``head``: machine lines and command)."""
    report = Report()
    report.add("## Likelihood", "", *head, "")
    report.add(
        "The maximum-likelihood mixture behind `log_likelihood_`, the standard errors and a "
        "sweep's BIC is `best_maximum_likelihood`'s: EM from the min-loss lines, from 10 "
        "random partitions (flexmix's `stepFlexmix(nrep = 10)` starts) and, in a sweep, from "
        "the (k - 1)-line maximum with a line split. flexmix: `stepFlexmix(y ~ ., k, nrep = 10)` "
        f"after `set.seed({SEED})`; mixreg: the default with `standard_errors=True`, "
        f"`random_state={SEED}`. Times are wall seconds on the shared machine (see the load).",
        "",
    )
    rows = record.get("sets", [])
    if rows:
        report.add(
            "### Per set",
            "",
            f"pass: mixreg's log-likelihood >= flexmix's - {LIKELIHOOD_SLACK}. `refit()` "
            "optimizes on from flexmix's EM fit before it takes the standard errors; its "
            "column is the log-likelihood at that point (computed by mixreg from refit()'s "
            "coefficients). Where the maxima agree (mixreg's within "
            f"{LIKELIHOOD_SLACK} of refit()'s point, flexmix kept k lines): the largest relative "
            "difference of mixreg's standard errors (coefficients, intercepts) from `refit()`'s, "
            f"lines matched by the Hungarian assignment; pass within "
            f"{SE_AGREEMENT:.0%}. The difference is shown wherever flexmix kept k lines and "
            "refit() made standard errors, but judged only where the maxima agree. The last "
            "column compares one point: mixreg's standard errors (observed information, in raw "
            "units) at refit()'s own coefficients beside refit()'s, so it measures the "
            "computation alone (refit() differentiates numerically). A flexmix maximum with a "
            f"line of fewer rows than its coefficients plus {MIN_RESIDUAL_ROWS} (weight times "
            "rows) is one mixreg calls spurious and does not keep (ADR 0029); such a set is "
            "marked so rather than judged.",
            "",
        )
        report.table(*sets_table(rows))
        below = [row["name"] for row in rows if set_verdict(row) == "**no**"]
        spurious_flexmix = [
            row["name"] for row in rows if set_verdict(row).startswith("flexmix spurious")
        ]
        at_points = [
            row["se_at_refit_point_difference"]
            for row in rows
            if row.get("se_at_refit_point_difference") is not None
        ]
        agreeing = agreeing_se_differences(rows)
        near = agreeing_se_differences(rows, NEAR_MAXIMUM)
        report.target(
            "log-likelihood >= flexmix's - 0.01, every set",
            f"{len(rows)} of {len(rows)}",
            f"{len(rows) - len(below)} of {len(rows)}"
            + (f" (below: {', '.join(below)})" if below else "")
            + (
                f" (flexmix at a spurious maximum, counted as met: {', '.join(spurious_flexmix)})"
                if spurious_flexmix
                else ""
            ),
            not below,
        )
        if at_points:
            report.target(
                "mixreg's SEs at refit()'s own point beside refit()'s (the computation alone)",
                f"within {SE_AGREEMENT:.0%}, every set",
                f"largest {100 * max(at_points):.3f} % on {len(at_points)} set(s)",
                max(at_points) <= SE_AGREEMENT,
            )
        report.target(
            f"SEs beside flexmix refit() where the maxima agree (within {LIKELIHOOD_SLACK})",
            f"within {SE_AGREEMENT:.0%}",
            f"largest {100 * max(agreeing):.2f} % on {len(agreeing)} set(s)"
            if agreeing
            else f"no set: refit()'s point is never within {LIKELIHOOD_SLACK} of mixreg's",
            bool(agreeing) and max(agreeing) <= SE_AGREEMENT,
        )
        if near:
            report.target(
                f"(shown beside) SEs where refit()'s point is within {NEAR_MAXIMUM} of mixreg's",
                f"within {SE_AGREEMENT:.0%}",
                f"largest {100 * max(near):.2f} % on {len(near)} set(s); "
                f"{sum(value <= SE_AGREEMENT for value in near)} within",
                max(near) <= SE_AGREEMENT,
            )
    sweeps = record.get("sweeps", [])
    if sweeps:
        report.add("### Sweep BIC curves", "")
        for sweep in sweeps:
            summary = sweep_summary(sweep)
            chosen_bic = sweep["mixreg_bic"][sweep["ks"].index(summary["chosen"])]
            report.add(
                f"{sweep['name']}, k = 1..{sweep['ks'][-1]}: mixreg "
                "`select_n_components(X, y, range(1, K + 1), random_state=0)` "
                f"({format_value(sweep['mixreg_seconds'], 1)} s) picks k = {summary['chosen']}; "
                f"flexmix `stepFlexmix(k = 1:K, nrep = 10)` "
                f"({format_value(sweep['flexmix_seconds'], 1)} s) has its lowest BIC at "
                f"k = {summary['flexmix_chosen']}. mixreg's log-likelihoods: "
                + (
                    f"no two within {SAME_VALUE} in a row."
                    if summary["distinct"]
                    else f"**two within {SAME_VALUE} in a row**."
                )
                + (
                    f" The lowest BIC of mixreg's fits at any k (the sweep's and the em "
                    f"n_init=10 fits', scored by `mixture_score`) is at k = {summary['lowest_k']}"
                    + (
                        " (the chosen k)"
                        if summary["lowest_k"] == summary["chosen"]
                        else " (**not** the chosen k)"
                    )
                    + "; the sweep's own BIC at the chosen k is "
                    + ("that lowest" if summary["lowest"] else "**above** that lowest")
                    + f" ({format_value(chosen_bic)} against "
                    f"{format_value(summary['lowest_bic'])})."
                    if "em_bic" in sweep
                    else ""
                ),
                "",
            )
            report.table(*sweep_table(sweep))
            report.target(
                f"sweep on {sweep['name']}: each k's likelihood from a fit at k",
                f"no two within {SAME_VALUE} in a row",
                "none" if summary["distinct"] else "two in a row",
                summary["distinct"],
            )
            if "em_bic" in sweep:
                report.target(
                    f"sweep on {sweep['name']}: the chosen k is that of mixreg's lowest BIC",
                    "same k",
                    f"chosen k = {summary['chosen']}, lowest at k = {summary['lowest_k']}",
                    summary["lowest_k"] == summary["chosen"],
                )
                report.target(
                    f"sweep on {sweep['name']}: the sweep's BIC at the chosen k the lowest",
                    f"within {2 * LIKELIHOOD_SLACK}",
                    f"{format_value(chosen_bic)} (lowest {format_value(summary['lowest_bic'])})",
                    summary["lowest"],
                )
    runs = record.get("realizable", [])
    if runs:
        counts = sorted({picked_true_k(runs, k)[1] for k in {run["true_k"] for run in runs}})
        report.add(
            "### Realizable sweeps",
            "",
            f"`mixreg.datasets.make_realizable({REALIZABLE_ROWS}, {REALIZABLE_FEATURES}, k, "
            f"noise={REALIZABLE_NOISE}, random_state=seed)` (lines at least 2 apart, noise sd "
            f"{REALIZABLE_NOISE}), then `select_n_components(X, y, range(1, k + 3), "
            "random_state=seed)`, seeds 0, 1, ...; "
            + (
                f"{counts[0]} seeds per true k."
                if len(counts) == 1
                else "seeds per true k as in the table (fewer for the larger k, whose sweeps "
                "take longest, to keep the run's time on the shared machine)."
            ),
            "",
        )
        rows_out = []
        for true_k in sorted({run["true_k"] for run in runs}):
            hits, total = picked_true_k(runs, true_k)
            mine = [run for run in runs if run["true_k"] == true_k]
            wrong = [
                f"seed {run['seed']}: k = {run['chosen_k']}"
                for run in mine
                if run["chosen_k"] != true_k
            ]
            gain = max(gains_beyond(run["log_likelihood"], true_k) for run in mine)
            rows_out.append(
                [
                    str(true_k),
                    f"{hits} / {total}",
                    ", ".join(wrong) or "-",
                    f"{gain:.2g}",
                    format_value(float(np.mean([run["seconds"] for run in mine])), 1),
                ]
            )
            report.target(
                f"realizable, true k = {true_k}",
                f">= {REALIZABLE_TARGET:.0%} of seeds",
                f"{hits} / {total}",
                hits >= REALIZABLE_TARGET * total,
            )
        report.table(
            [
                "true k",
                "seeds picking it",
                "wrong picks",
                "largest gain of k + 1, k + 2 over the true k's log-lik",
                "mean s per sweep",
            ],
            rows_out,
        )
    report.add("Runs of the parts (load average over 1, 5, 15 min at the start and the end):", "")
    report.table(
        ["part", "command", "finished", "load at start", "load at end", "minutes"],
        [
            [
                part,
                f"`{run['command']}`",
                run["date"],
                run["load_start"],
                run["load_end"],
                f"{run['minutes']:.1f}",
            ]
            for part, run in sorted(record.get("parts", {}).items())
        ],
    )
    report.targets_table(report.targets)
    return report


# --------------------------------------------------------------------------- measuring


def measure_set(data: DataSet, k: int) -> dict[str, Any]:
    """mixreg's default (standard errors on) beside flexmix's stepFlexmix on one set."""
    log(f"per set: {data.name}, k = {k}")
    began = time.perf_counter()
    fitted = MixtureOfLinearRegressions(k, random_state=SEED, standard_errors=True).fit(
        data.X, data.y
    )
    seconds = time.perf_counter() - began
    flexmix = FlexmixRun(data.X, data.y, "fit", k).result()
    row: dict[str, Any] = {
        "name": data.name,
        "n": len(data.y),
        "k": k,
        "mixreg_log_likelihood": float(fitted.log_likelihood_),
        "mixreg_seconds": seconds,
        "ml_start": str(fitted.ml_start_),
        "flexmix_log_likelihood": float(flexmix["log_likelihood"]),
        "flexmix_kept": int(flexmix["n_kept"]),
        "flexmix_seconds": float(flexmix["seconds"]),
        "se_difference": None,
        "flexmix_refit_log_likelihood": None,
        # flexmix's fit as R wrote it (priors, sigmas, lines): to look into a gap later.
        "flexmix_fit": flexmix,
    }
    row = annotate_refit_point(row, data.X, data.y)
    theirs_se = flexmix_standard_errors(flexmix, data.X.shape[1])
    # Measured wherever refit() made them; it counts only where the maxima agree (the table
    # says which).
    if theirs_se is not None:
        ours = np.column_stack([fitted.ml_coef_, fitted.ml_intercept_])
        ours_se = np.column_stack([fitted.coef_se_, fitted.intercept_se_])
        row["se_difference"] = largest_se_difference(
            ours, ours_se, flexmix_lines(flexmix, data.X.shape[1]), theirs_se
        )
    return row


def measure_sweep(data: DataSet, flexmix_run: FlexmixRun, with_em: bool) -> dict[str, Any]:
    """mixreg's sweep beside flexmix's (``flexmix_run``, started before) over k = 1..K, and
    em n_init=10 fits at every k when ``with_em``."""
    top = data.n_components[0]
    ks = list(range(1, top + 1))
    log(f"sweep: {data.name}, k = 1..{top}")
    began = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        selection = mixreg.select_n_components(data.X, data.y, ks, random_state=SEED)
    seconds = time.perf_counter() - began
    sweep: dict[str, Any] = {
        "name": data.name,
        "ks": ks,
        "mixreg_log_likelihood": [fit.score.log_likelihood for fit in selection.fits],
        "mixreg_bic": [fit.score.bic for fit in selection.fits],
        "mixreg_start": [fit.score.start or "-" for fit in selection.fits],
        "mixreg_chosen_k": selection.best_n_components,
        "mixreg_seconds": seconds,
        "mixreg_warnings": sorted({str(warning.message) for warning in caught}),
    }
    if with_em:
        sweep["em_log_likelihood"], sweep["em_bic"] = [], []
        sweep["em_seconds"] = 0.0
        for k in ks:
            log(f"sweep: {data.name}, em n_init=10 at k = {k}")
            began = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                em = MixtureOfLinearRegressions(
                    k, algorithm="em", n_init=10, random_state=SEED
                ).fit(data.X, data.y)
                score = mixreg.mixture_score(
                    data.X, data.y, em.coef_, em.intercept_, fit_intercept=True, random_state=SEED
                )
            sweep["em_log_likelihood"].append(score.log_likelihood)
            sweep["em_bic"].append(score.bic)
            sweep["em_seconds"] += time.perf_counter() - began
    log(f"sweep: {data.name}, waiting for flexmix")
    flexmix = flexmix_run.result()
    sweep.update(
        flexmix_log_likelihood=[float(fit["log_likelihood"]) for fit in flexmix["fits"]],
        flexmix_bic=[float(fit["bic"]) for fit in flexmix["fits"]],
        flexmix_kept=[int(fit["n_kept"]) for fit in flexmix["fits"]],
        flexmix_seconds=float(flexmix["seconds"]),
    )
    return sweep


def measure_realizable(
    true_ks: Sequence[int], seeds: int, seeds_large: int
) -> list[dict[str, Any]]:
    """One sweep k = 1..true k + 2 per (true k, seed); ``seeds_large`` seeds for k >= 6."""
    runs = []
    for true_k in true_ks:
        for seed in range(seeds if true_k < 6 else seeds_large):
            log(f"realizable: true k = {true_k}, seed {seed}")
            X, y, *_ = make_realizable(
                REALIZABLE_ROWS,
                REALIZABLE_FEATURES,
                true_k,
                noise=REALIZABLE_NOISE,
                random_state=seed,
            )
            began = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                selection = mixreg.select_n_components(
                    X, y, range(1, true_k + 3), random_state=seed
                )
            runs.append(
                {
                    "true_k": true_k,
                    "seed": seed,
                    "chosen_k": selection.best_n_components,
                    "seconds": time.perf_counter() - began,
                    "log_likelihood": [fit.score.log_likelihood for fit in selection.fits],
                    "bic": [fit.score.bic for fit in selection.fits],
                }
            )
    return runs


def load_runs(path: Path) -> dict[str, Any]:
    """The saved results (empty when there are none)."""
    if not path.exists():
        return {}
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def update_runs(path: Path, updates: dict[str, Any]) -> dict[str, Any]:
    """Merge ``updates`` into the saved results and save them, under a lock (parts may run in
    several processes at once): realizable runs replace only those of the same true k's."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = load_runs(path)
        for key, value in updates.items():
            if key == "realizable":
                true_ks = {run["true_k"] for run in value}
                kept = [run for run in record.get(key, []) if run["true_k"] not in true_ks]
                value = sorted(kept + value, key=lambda run: (run["true_k"], run["seed"]))
            elif key == "parts":
                value = {**record.get(key, {}), **value}
            record[key] = value
        path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def part_run(command: str, began: float, load_start: str) -> dict[str, Any]:
    """When and how a part ran: command, date, load at its start and end, minutes."""
    return {
        "command": command,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_start": load_start,
        "load_end": load_average(),
        "minutes": (time.perf_counter() - began) / 60,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.likelihood",
        description="mixreg's maximum likelihood and k sweeps beside flexmix; writes the "
        "section Likelihood of bench/RESULTS.md.",
    )
    parser.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    parser.add_argument("--seeds", type=int, default=10, help="realizable seeds per true k < 6")
    parser.add_argument(
        "--seeds-large", type=int, default=10, help="realizable seeds per true k >= 6"
    )
    parser.add_argument(
        "--true-k",
        type=int,
        nargs="*",
        default=list(REALIZABLE_TRUE_K),
        help="the realizable part's true k's (the saved runs of the others are kept)",
    )
    parser.add_argument("--runs", type=Path, default=RUNS)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--summary-only", action="store_true", help="rebuild the section from --runs"
    )
    args = parser.parse_args(argv)
    command = "python -m bench.likelihood" + "".join(
        f" {arg}" for arg in (argv if argv is not None else sys.argv[1:])
    )
    record = load_runs(args.runs)
    if not args.summary_only:
        needs_r = {"sets", "sweeps", "refit-points"} & set(args.parts)
        reason = r_unavailable_reason() if needs_r else None
        if reason:
            print(f"bench.likelihood: flexmix cannot run ({reason}); nothing written")
            return
        record = update_runs(
            args.runs, {"head": machine_lines(command, also=r_versions() if needs_r else None)}
        )
        if needs_r:
            with tempfile.TemporaryDirectory() as folder:
                sets, sweeps = all_sets(Path(folder))
            if "sets" in args.parts:
                began, load_start = time.perf_counter(), load_average()
                rows = [measure_set(data, k) for data in sets for k in data.n_components]
                record = update_runs(
                    args.runs,
                    {"sets": rows, "parts": {"sets": part_run(command, began, load_start)}},
                )
            if "sweeps" in args.parts:
                began, load_start = time.perf_counter(), load_average()
                # Every flexmix sweep starts now; mixreg's run meanwhile.
                started = [
                    FlexmixRun(data.X, data.y, "sweep", data.n_components[0])
                    for data in sweeps.values()
                ]
                curves = [
                    measure_sweep(data, run, with_em=data.name.startswith("price-like"))
                    for data, run in zip(sweeps.values(), started, strict=True)
                ]
                record = update_runs(
                    args.runs,
                    {"sweeps": curves, "parts": {"sweeps": part_run(command, began, load_start)}},
                )
        if "refit-points" in args.parts and record.get("sets"):
            # The saved sets' flexmix fits judged at refit()'s point (no fit runs).
            with tempfile.TemporaryDirectory() as folder:
                by_name = {data.name: data for data in all_sets(Path(folder))[0]}
            rows = [
                annotate_refit_point(row, by_name[row["name"]].X, by_name[row["name"]].y)
                for row in record["sets"]
            ]
            record = update_runs(args.runs, {"sets": rows})
        if "realizable" in args.parts:
            began, load_start = time.perf_counter(), load_average()
            runs = measure_realizable(args.true_k, args.seeds, args.seeds_large)
            key = "realizable k=" + ",".join(map(str, args.true_k))
            record = update_runs(
                args.runs,
                {"realizable": runs, "parts": {key: part_run(command, began, load_start)}},
            )
    if not record:
        print("bench.likelihood: no saved results to summarize")
        return
    report = build_section(record, record.get("head", machine_lines(command)))
    write_section(args.output, SECTION, "\n".join(report.lines))


if __name__ == "__main__":
    main()
