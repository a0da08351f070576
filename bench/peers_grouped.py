"""mixreg's grouped fits side by side with flexmix's grouped regression (``y ~ x | g``).

Run ``python -m bench.peers_grouped`` (``make bench-peers-grouped``). It needs ``Rscript`` with
the R packages flexmix and jsonlite; when they are missing it prints why and exits without
writing anything. It writes its own section of ``bench/RESULTS.md``, between the lines
``<!-- peers-grouped:start -->`` and ``<!-- peers-grouped:end -->``. flexmix's fits are kept in
``bench/peers_grouped_runs.json``; ``--reuse-r`` takes them from there, so the section can be
written again without R.

Two data sets in which every group (a user) draws all its rows from one of k segment lines,
each split once by group (seeded) into training groups and holdout groups:

- a MovieLens-style set: 400 users rating 10 to 60 items each from a catalog of 1,500 items
  whose embeddings (4 standard normal numbers) are the features; every user belongs to one
  of 3 taste segments (a standard normal taste, a bias uniform in [2.5, 4]); rating noise 1;
- synthetic segments: 600 groups of 5 to 50 rows on 2 uniform features in [-1, 1], every
  group on one of 3 crossing lines; noise 2, so single rows seldom tell their line and a
  group of 5 rows may not either.

flexmix: ``stepFlexmix(y ~ x1 + ... | g, k, nrep = 5, model = FLXMRglm())`` (the best of its
random starts by log-likelihood). mixreg: ``MixtureOfLinearRegressions(k, algorithm="em",
n_init=5)`` and ``algorithm="auto"`` fitted with ``groups``. Every fit is scored here by one
set of functions on its lines, noise deviations and priors: the grouped Gaussian mixture's
log-likelihood with groups as units, ``sum_g log sum_j pi_j prod_{i in g} N(y_i; <x_i, coef_j>
+ intercept_j, sigma_j^2)``, on the training and on the holdout groups; the grouped min-loss
``(1/n) sum_g min_j sum_{i in g} r_ij^2``; and the share of groups whose most likely line
(under the fitted mixture) is their true segment, after matching lines to segments by the
best permutation. ``auto`` fits min-loss lines and, with groups, reports beside them the
maximum-likelihood mixture grouped EM reaches from them (``ml_coef_``, ``ml_intercept_``,
``noise_variance_``, ``weights_``): the likelihoods and shares score that mixture, the min-loss
its min-loss lines. Times are the fit's CPU seconds (wall seconds beside them; R's
from ``proc.time`` around ``stepFlexmix``): the machine is shared.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.sections import Report, load_average, log, machine_lines, write_section
from mixreg import MixtureOfLinearRegressions, predict_lines

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]

HERE = Path(__file__).resolve().parent
R_SCRIPT = HERE / "peers_r" / "fit_grouped.R"
RESULTS = HERE / "RESULTS.md"
RUNS = HERE / "peers_grouped_runs.json"
SECTION = "peers-grouped"
FLEXMIX_STARTS = 5
MIXREG_STARTS = FLEXMIX_STARTS
"""As many starts as flexmix's random starts."""
# Two fits that reach the same maximum differ in the last digits of their log-likelihoods.
SAME_LIKELIHOOD = 1e-6
METHODS = ("em", "auto")


@dataclass(frozen=True)
class Rows:
    """Rows of whole groups: ``group`` codes 0..n_groups-1 and each group's true segment."""

    X: FloatArray
    y: FloatArray
    group: IntArray
    segment: IntArray

    @property
    def n_groups(self) -> int:
        return len(self.segment)


@dataclass(frozen=True)
class Case:
    """A grouped data set split by group into training and holdout rows."""

    name: str
    n_components: int
    train: Rows
    test: Rows


@dataclass(frozen=True)
class GroupedFit:
    """A fitted grouped mixture in the caller's units, with its fit time, and the lines its
    min-loss is scored on (the mixture's own when None)."""

    coef: FloatArray
    intercept: FloatArray
    sigma: FloatArray
    prior: FloatArray
    seconds: float
    cpu_seconds: float
    min_loss_lines: tuple[FloatArray, FloatArray] | None = None


def group_log_densities(fit: GroupedFit, rows: Rows) -> FloatArray:
    """Shape (n_groups, k): the log of each group's prior times the density of all its rows on
    each line."""
    residuals = rows.y[:, None] - predict_lines(rows.X, fit.coef, fit.intercept)
    row_log_density = -np.log(fit.sigma * np.sqrt(2.0 * np.pi)) - 0.5 * (residuals / fit.sigma) ** 2
    by_group = np.zeros((rows.n_groups, len(fit.intercept)))
    np.add.at(by_group, rows.group, row_log_density)
    return by_group + np.log(np.maximum(fit.prior, np.finfo(np.float64).tiny))


def grouped_log_likelihood(fit: GroupedFit, rows: Rows) -> float:
    """``sum_g log sum_j pi_j prod_{i in g} N(y_i; line_j(x_i), sigma_j^2)``."""
    log_joint = group_log_densities(fit, rows)
    top = log_joint.max(axis=1)
    return float((top + np.log(np.exp(log_joint - top[:, None]).sum(axis=1))).sum())


def grouped_min_loss(fit: GroupedFit, rows: Rows) -> float:
    """``(1/n) sum_g min_j sum_{i in g} r_ij^2``."""
    coef, intercept = fit.min_loss_lines or (fit.coef, fit.intercept)
    residuals = rows.y[:, None] - predict_lines(rows.X, coef, intercept)
    by_group = np.zeros((rows.n_groups, len(fit.intercept)))
    np.add.at(by_group, rows.group, residuals**2)
    return float(by_group.min(axis=1).sum() / len(rows.y))


def share_on_true_segment(assigned: IntArray, segment: IntArray, n_components: int) -> float:
    """The share of groups whose line is their segment, lines matched to segments by the
    permutation that matches most groups."""
    counts = np.zeros((max(int(assigned.max()) + 1, n_components), n_components))
    np.add.at(counts, (assigned, segment), 1.0)
    best = max(
        counts[list(lines), range(n_components)].sum()
        for lines in itertools.permutations(range(counts.shape[0]), n_components)
    )
    return float(best / len(segment))


def scores(fit: GroupedFit, case: Case) -> dict[str, float]:
    """Train and holdout log-likelihood, training min-loss and the shares on the true segment."""
    k = case.n_components
    return {
        "train": grouped_log_likelihood(fit, case.train),
        "holdout": grouped_log_likelihood(fit, case.test),
        "min_loss": grouped_min_loss(fit, case.train),
        "train_correct": share_on_true_segment(
            group_log_densities(fit, case.train).argmax(axis=1), case.train.segment, k
        ),
        "holdout_correct": share_on_true_segment(
            group_log_densities(fit, case.test).argmax(axis=1), case.test.segment, k
        ),
    }


def split_by_group(name: str, k: int, rows: Rows, holdout: float) -> Case:
    """The case with a seeded random ``holdout`` share of the groups held out."""
    order = np.random.default_rng(0).permutation(rows.n_groups)
    held = np.zeros(rows.n_groups, dtype=bool)
    held[order[: round(holdout * rows.n_groups)]] = True

    def part(keep: NDArray[np.bool_]) -> Rows:
        on = keep[rows.group]
        kept_groups, codes = np.unique(rows.group[on], return_inverse=True)
        return Rows(rows.X[on], rows.y[on], codes.astype(np.intp), rows.segment[kept_groups])

    return Case(name, k, part(~held), part(held))


def movielens_style(n_users: int = 400, n_items: int = 1500, seed: int = 0) -> Case:
    """Users (groups) rating catalog items (embeddings as features), one taste segment each."""
    rng = np.random.default_rng(seed)
    k, d = 3, 4
    items = rng.standard_normal((n_items, d))
    tastes, biases = rng.standard_normal((k, d)), rng.uniform(2.5, 4.0, size=k)
    segment = rng.permutation(np.arange(n_users) % k)
    group = np.repeat(np.arange(n_users), rng.integers(10, 61, size=n_users))
    X = items[rng.integers(0, n_items, size=group.size)]
    y = predict_lines(X, tastes, biases)[np.arange(group.size), segment[group]]
    y += rng.standard_normal(group.size)
    rows = Rows(X, y, group.astype(np.intp), segment)
    return split_by_group(f"MovieLens-style, {n_users} users, k = {k}", k, rows, holdout=0.25)


def segments(n_groups: int = 600, seed: int = 0) -> Case:
    """Groups of 5 to 50 rows, each on one of 3 crossing lines."""
    rng = np.random.default_rng(seed)
    slopes = np.array([[3.0, 0.0], [-3.0, 1.0], [0.0, -3.0]])
    intercepts = np.array([0.0, 2.0, -2.0])
    segment = rng.permutation(np.arange(n_groups) % 3)
    group = np.repeat(np.arange(n_groups), rng.integers(5, 51, size=n_groups))
    X = rng.uniform(-1.0, 1.0, size=(group.size, 2))
    y = predict_lines(X, slopes, intercepts)[np.arange(group.size), segment[group]]
    y += 2.0 * rng.standard_normal(group.size)
    rows = Rows(X, y, group.astype(np.intp), segment)
    return split_by_group(f"segments, {n_groups} groups of 5-50 rows, k = 3", 3, rows, 0.25)


def fit_mixreg(case: Case, algorithm: str, seed: int) -> GroupedFit:
    """mixreg's grouped fit of the training rows."""
    model = MixtureOfLinearRegressions(
        n_components=case.n_components,
        algorithm=algorithm,
        n_init=MIXREG_STARTS,
        random_state=seed,
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    model.fit(case.train.X, case.train.y, groups=case.train.group)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    sigma, prior = np.sqrt(model.noise_variance_), model.weights_
    if algorithm == "em":
        return GroupedFit(model.coef_, model.intercept_, sigma, prior, seconds, cpu_seconds)
    return GroupedFit(
        model.ml_coef_,
        model.ml_intercept_,
        sigma,
        prior,
        seconds,
        cpu_seconds,
        min_loss_lines=(model.coef_, model.intercept_),
    )


def fit_flexmix(
    case: Case, seeds: list[int], rscript: str, workdir: Path, runs: dict[str, Any]
) -> list[GroupedFit | str]:
    """flexmix's fits for every seed (a message for a seed whose fit failed); R's answers are
    kept in ``runs`` under the case's name, and taken from there when they are already in it
    for these seeds (``--reuse-r``)."""
    saved = runs.get(case.name)
    if saved is None or [result["seed"] for result in saved] != seeds:
        train = workdir / "train.csv"
        output = workdir / "flexmix.json"
        d = case.train.X.shape[1]
        np.savetxt(
            train,
            np.column_stack([case.train.y, case.train.group, case.train.X]),
            delimiter=",",
            header=",".join(["y", "g"] + [f"x{j}" for j in range(d)]),
            comments="",
        )
        subprocess.run(
            [
                rscript,
                str(R_SCRIPT),
                str(train),
                str(d),
                str(case.n_components),
                ",".join(map(str, seeds)),
                str(FLEXMIX_STARTS),
                str(output),
            ],
            check=True,
            capture_output=True,
        )
        saved = runs[case.name] = json.loads(output.read_text())
    return [flexmix_fit(result, case.train.X.shape[1]) for result in saved]


def flexmix_fit(result: dict[str, Any], n_features: int) -> GroupedFit | str:
    """One seed's answer of ``fit_grouped.R`` as a fit, or its error message."""
    if result["status"] != "ok":
        return str(result["message"])
    return GroupedFit(
        coef=np.array(result["coef"], dtype=np.float64).reshape(-1, n_features),
        intercept=np.atleast_1d(np.array(result["intercept"], dtype=np.float64)),
        sigma=np.atleast_1d(np.array(result["sigma"], dtype=np.float64)),
        prior=np.atleast_1d(np.array(result["prior"], dtype=np.float64)),
        seconds=float(result["seconds"]),
        cpu_seconds=float(result["cpu_seconds"]),
    )


def r_unavailable_reason(rscript: str) -> str | None:
    """Why R cannot run the comparison here, or None."""
    if shutil.which(rscript) is None:
        return f"{rscript} is not on the PATH"
    check = subprocess.run(
        [rscript, "-e", "library(flexmix); library(jsonlite)"], capture_output=True, text=True
    )
    if check.returncode != 0:
        return f"the R packages flexmix and jsonlite are needed: {check.stderr.strip()[-200:]}"
    return None


def summarize(fits: list[GroupedFit], case: Case) -> dict[str, float]:
    """Means over the seeds' fits of their scores and times, and the worst holdout."""
    scored = [scores(fit, case) for fit in fits]
    summary = {key: float(np.mean([score[key] for score in scored])) for key in scored[0]}
    summary["worst_holdout"] = min(score["holdout"] for score in scored)
    summary["seconds"] = float(np.mean([fit.seconds for fit in fits]))
    summary["cpu"] = float(np.mean([fit.cpu_seconds for fit in fits]))
    return summary


def report_case(
    report: Report, rows: list[list[str]], case: Case, summaries: dict[str, dict[str, float]]
) -> None:
    """The case's rows of the table and its targets: every mixreg method against flexmix."""
    flexmix = summaries["flexmix"]
    for label, line in summaries.items():
        rows.append(
            [
                case.name,
                label,
                f"{line['train']:.1f}",
                f"{line['holdout']:.1f} (worst {line['worst_holdout']:.1f})",
                f"{line['min_loss']:.4f}",
                f"{line['train_correct']:.3f} / {line['holdout_correct']:.3f}",
                f"{line['cpu']:.2f} ({line['seconds']:.2f})",
            ]
        )
    for method in METHODS:
        ours = summaries[f"mixreg {method}"]
        for scored in ("train", "holdout"):
            report.target(
                f"{case.name}: {method} {scored} log-likelihood",
                f">= flexmix's (within {SAME_LIKELIHOOD:g} relative)",
                f"{ours[scored]:.3f} vs {flexmix[scored]:.3f}",
                ours[scored] >= flexmix[scored] - SAME_LIKELIHOOD * abs(flexmix[scored]),
            )
        speedup = flexmix["cpu"] / ours["cpu"]
        report.target(
            f"{case.name}: {method} fit time (CPU)",
            ">= 10x faster than flexmix",
            f"{speedup:.1f}x ({ours['cpu']:.2f} s vs {flexmix['cpu']:.2f} s)",
            speedup >= 10,
        )


HEADER = [
    "data",
    "method",
    "train log-lik",
    "holdout log-lik",
    "train min-loss",
    "groups on true segment (train / holdout)",
    "CPU seconds (wall)",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1 (default 3)")
    parser.add_argument("--rscript", default="Rscript")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--runs", type=Path, default=RUNS, help="flexmix's cached fits")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="groups of each set, times this (default 1)"
    )
    parser.add_argument(
        "--reuse-r",
        action="store_true",
        help="take flexmix's fits from the --runs file where it has them for these seeds",
    )
    arguments = parser.parse_args(argv)
    runs: dict[str, Any] = (
        json.loads(arguments.runs.read_text())
        if arguments.reuse_r and arguments.runs.exists()
        else {}
    )
    cases = (
        movielens_style(n_users=round(400 * arguments.scale)),
        segments(n_groups=round(600 * arguments.scale)),
    )
    seeds = list(range(arguments.seeds))
    if not all(case.name in runs for case in cases):
        reason = r_unavailable_reason(arguments.rscript)
        if reason is not None:
            print(f"bench.peers_grouped: skipped: {reason}")
            return 0
    report = Report()
    rows: list[list[str]] = []
    report.add(
        "## Grouped fits beside flexmix's `y ~ x | g`",
        "",
        *machine_lines(
            f"python -m bench.peers_grouped --seeds {arguments.seeds}"
            + (f" --scale {arguments.scale:g}" if arguments.scale != 1.0 else "")
            + (" --reuse-r" if arguments.reuse_r else "")
        ),
        "",
        f"Mean over seeds 0..{seeds[-1]}; every score computed here by one function for all "
        "fits, groups as units (see the module's docstring). mixreg: `em` and `auto` "
        f"(n_init = {MIXREG_STARTS}) with groups; flexmix: stepFlexmix with nrep = "
        f"{FLEXMIX_STARTS}. `auto`'s min-loss is that of its min-loss lines, its likelihoods "
        "and shares those of the maximum-likelihood mixture it reports beside them (grouped EM "
        "from its lines, or its best EM start when higher). Both fit on one core, so the speed "
        "target compares CPU seconds: the shared machine's load stretches wall time.",
        "",
    )
    with tempfile.TemporaryDirectory() as directory:
        for case in cases:
            summaries: dict[str, dict[str, float]] = {}
            for method in METHODS:
                log(f"{case.name}: mixreg {method}")
                fits = [fit_mixreg(case, method, seed) for seed in seeds]
                summaries[f"mixreg {method}"] = summarize(fits, case)
            log(f"{case.name}: flexmix")
            theirs = fit_flexmix(case, seeds, arguments.rscript, Path(directory), runs)
            arguments.runs.write_text(json.dumps(runs, indent=1) + "\n")
            failed = [fit for fit in theirs if isinstance(fit, str)]
            summaries["flexmix"] = summarize(
                [fit for fit in theirs if isinstance(fit, GroupedFit)], case
            )
            report_case(report, rows, case, summaries)
            if failed:
                rows.append([case.name, "flexmix failures", str(len(failed)), failed[0][:80]])
    report.table(HEADER, rows)
    report.targets_table(report.targets)
    report.add(f"Load average (1, 5, 15 min) at the end: {load_average()}")
    write_section(arguments.results, SECTION, "\n".join(report.lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
