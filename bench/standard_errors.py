"""Standard errors: beside ``flexmix::refit``, coverage by simulation, and speed.

``python -m bench.standard_errors`` writes the section "Standard errors" of
``bench/RESULTS.md``:

- flexmix: on flexmix's ``NregFix`` (y ~ x1 + x2 + w, k = 3), mixtools' ``tonedata``
  (tuned ~ stretchratio, k = 2) and a realizable set (k = 2, d = 2, n = 500), mixreg fits
  (``auto``) with ``standard_errors=True``; flexmix's EM is started from the posteriors of
  mixreg's maximum-likelihood fit (so both reach the same one: the log-likelihoods are shown)
  and ``refit()`` gives its standard errors. Each line's coefficient, intercept and sigma
  standard errors are compared (flexmix's log(sigma)'s with mixreg's noise variance's,
  ``se(s^2) / 2s^2``). On ``NregFix`` also a gated fit (lines y ~ x1 + x2, gate ~ w), beside
  ``refit()`` of flexmix's concomitant model started from mixreg's posteriors: the lines' and
  the gate's standard errors.
- coverage: the 95 % intervals of the coefficients and intercepts of k = 2 and k = 3
  separated lines, n = 500 and 5,000, over ``--replications`` (400) simulated data sets.
- speed: the standard errors of a fit of n = 10^6, d = 20, k = 4 (the estimator's step that
  computes them, timed on its own in a child process), with ``--before DIR`` beside the same
  step of the code in ``DIR`` (``git archive <commit> mixreg | tar -x -C DIR``), in
  alternating rounds; and a 200-replicate bootstrap of n = 5,000, d = 5, k = 3 beside the
  same computation without the Newton finish (EM to the tight tolerance), in the same run.
  ``--skip flexmix coverage`` runs the speed section alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from bench.peers import r_unavailable_reason, r_versions
from bench.sections import Report, load_average, log, machine_lines, write_section
from mixreg import MixtureOfLinearRegressions
from mixreg._bootstrap import bootstrap_replicates
from mixreg._inference import match_lines, maximum_likelihood_polish
from mixreg._loss import single_threaded_blas
from mixreg._scaling import Scaling

FloatArray = NDArray[np.float64]

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "standard-errors"
SPEED_SECTION = "standard-errors-speed"
R_SCRIPT = REPO_ROOT / "bench" / "peers_r" / "refit_standard_errors.R"
EXPORT_R_DATA = (
    'suppressMessages({library(flexmix); library(mixtools)}); data("NregFix"); '
    "write.csv(data.frame(y = NregFix$y, x1 = NregFix$x1, "
    "x2 = as.numeric(as.character(NregFix$x2)), w = as.numeric(as.character(NregFix$w))), "
    'file.path(commandArgs(TRUE)[1], "nregfix.csv"), row.names = FALSE); data("tonedata"); '
    "write.csv(data.frame(y = tonedata$tuned, x1 = tonedata$stretchratio), "
    'file.path(commandArgs(TRUE)[1], "tone.csv"), row.names = FALSE)'
)
SE_AGREEMENT = 0.05
COVERAGE_RANGE = (0.93, 0.97)
SE_SECONDS = 5.0
BOOTSTRAP_SECONDS = 30.0


def realizable(
    rng: np.random.Generator, n: int, coef: FloatArray, intercept: FloatArray, noise: float
) -> tuple[FloatArray, FloatArray]:
    """Rows of k lines with equal weights and Gaussian noise."""
    X = rng.standard_normal((n, coef.shape[1]))
    lines = rng.integers(0, coef.shape[0], size=n)
    y = np.einsum("ij,ij->i", X, coef[lines]) + intercept[lines] + noise * rng.standard_normal(n)
    return X, y


def posteriors(fitted: MixtureOfLinearRegressions, X: FloatArray, y: FloatArray) -> FloatArray:
    """Each row's posterior of each line of the maximum-likelihood fit."""
    residuals = y[:, None] - X @ fitted.ml_coef_.T - fitted.ml_intercept_
    log_joint = (
        np.log(fitted.weights_)
        - 0.5 * np.log(2 * np.pi * fitted.noise_variance_)
        - residuals**2 / (2 * fitted.noise_variance_)
    )
    joint = np.exp(log_joint - log_joint.max(axis=1, keepdims=True))
    result: FloatArray = joint / joint.sum(axis=1, keepdims=True)
    return result


def flexmix_refit(
    X: FloatArray, y: FloatArray, start: FloatArray, folder: Path
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, float]:
    """flexmix started from ``start`` posteriors: per line (coef then intercept) estimates and
    standard errors, log(sigma)'s, and the log-likelihood."""
    data, out = folder / "refit_in.csv", folder / "refit_out.csv"
    d, k = X.shape[1], start.shape[1]
    header = ",".join(
        ["y", *(f"x{index + 1}" for index in range(d)), *(f"p{j + 1}" for j in range(k))]
    )
    np.savetxt(
        data,
        np.column_stack([y, X, start]),
        fmt="%.17g",
        delimiter=",",
        header=header,
        comments="",
    )
    subprocess.run(["Rscript", str(R_SCRIPT), str(data), str(out)], check=True)
    rows = np.genfromtxt(out, delimiter=",", names=True, dtype=None, encoding="utf-8")
    names = [str(name).strip('"') for name in rows["name"]]
    values = dict(zip(names, zip(rows["estimate"], rows["std_error"], strict=True), strict=True))
    lines = np.empty((k, d + 1, 2))
    sigma = np.empty((k, 2))
    for j in range(k):
        prefix = f"model.1_Comp.{j + 1}_"
        for column in range(d):
            lines[j, column] = values[f"{prefix}coef.x{column + 1}"]
        lines[j, d] = values[f"{prefix}coef.(Intercept)"]
        sigma[j] = values[f"{prefix}log(sigma)"]
    return lines[..., 0], lines[..., 1], sigma[:, 0], sigma[:, 1], float(values["logLik"][0])


def compare_with_flexmix(report: Report, data_folder: Path) -> None:
    """The table of mixreg's and flexmix's standard errors on the three sets."""
    rng = np.random.default_rng(20)
    sets: list[tuple[str, FloatArray, FloatArray, int]] = []
    nreg = np.genfromtxt(data_folder / "nregfix.csv", delimiter=",", skip_header=1)
    sets.append(("NregFix (flexmix), y ~ x1 + x2 + w", nreg[:, 1:], nreg[:, 0], 3))
    tone = np.genfromtxt(data_folder / "tone.csv", delimiter=",", skip_header=1)
    sets.append(("tonedata (mixtools), tuned ~ stretchratio", tone[:, 1:], tone[:, 0], 2))
    X, y = realizable(rng, 500, np.array([[2.0, -1.0], [-1.5, 1.0]]), np.array([0.0, 3.0]), 1.0)
    sets.append(("realizable, k = 2, d = 2, n = 500", X, y, 2))
    rows, worst = [], 0.0
    for name, X, y, k in sets:
        log(f"flexmix beside mixreg on {name}")
        fitted = MixtureOfLinearRegressions(k, standard_errors=True, random_state=0).fit(X, y)
        with tempfile.TemporaryDirectory() as folder:
            est, se, sigma, sigma_se, loglik = flexmix_refit(
                X, y, posteriors(fitted, X, y), Path(folder)
            )
        ours = np.column_stack([fitted.ml_coef_, fitted.ml_intercept_])
        ours_se = np.column_stack([fitted.coef_se_, fitted.intercept_se_])
        order = match_lines(ours, est)
        est, se, sigma, sigma_se = est[order], se[order], sigma[order], sigma_se[order]
        # flexmix's parameter is log(sigma): se(log sigma) = se(s^2) / (2 s^2).
        ours_sigma_se = fitted.noise_variance_se_ / (2 * fitted.noise_variance_)
        ratios = np.concatenate([(ours_se / se).ravel(), ours_sigma_se / sigma_se])
        deviation = float(np.max(np.abs(ratios - 1)))
        worst = max(worst, deviation)
        rows.append(
            [
                name,
                str(k),
                f"{fitted.log_likelihood_:.6f} / {loglik:.6f}",
                f"{np.max(np.abs(ours - est)):.1e}",
                f"{ratios.min():.4f} - {ratios.max():.4f}",
                f"{100 * deviation:.2f} %",
            ]
        )
        report.add(
            f"Per line of {name}: mixreg SE / flexmix SE (coefficients, intercept, log(sigma))"
        )
        report.table(
            ["line", *[f"x{c + 1}" for c in range(X.shape[1])], "(Intercept)", "log(sigma)"],
            [
                [
                    str(j),
                    *[f"{v:.5g} / {w:.5g}" for v, w in zip(ours_se[j], se[j], strict=True)],
                    f"{ours_sigma_se[j]:.5g} / {sigma_se[j]:.5g}",
                ]
                for j in range(k)
            ],
        )
    report.add(
        "Summary: log-likelihood mixreg / flexmix, largest difference of the estimates, "
        "range of the SE ratios, largest relative difference"
    )
    report.table(
        ["data", "k", "log-likelihood", "max |estimate diff|", "SE ratio", "max rel. diff"], rows
    )
    report.target(
        "SEs beside flexmix::refit",
        f"within {SE_AGREEMENT:.0%}",
        f"largest difference {100 * worst:.2f} %",
        worst <= SE_AGREEMENT,
    )


def gated_posteriors(
    fitted: MixtureOfLinearRegressions, X: FloatArray, y: FloatArray, Z: FloatArray
) -> FloatArray:
    """Each row's posterior of each line of a gated fit (gate probability times density)."""
    residuals = y[:, None] - X @ fitted.coef_.T - fitted.intercept_
    log_joint = (
        np.log(fitted.predict_proba(X, Z))
        - 0.5 * np.log(2 * np.pi * fitted.noise_variance_)
        - residuals**2 / (2 * fitted.noise_variance_)
    )
    joint = np.exp(log_joint - log_joint.max(axis=1, keepdims=True))
    result: FloatArray = joint / joint.sum(axis=1, keepdims=True)
    return result


def compare_gated_with_flexmix(report: Report, data_folder: Path) -> None:
    """mixreg's standard errors of a gated fit beside ``flexmix::refit`` of the concomitant
    model on NregFix (lines y ~ x1 + x2, gate ~ w), flexmix started from mixreg's posteriors
    (so its first component, the gate's reference, is mixreg's)."""
    nreg = np.genfromtxt(data_folder / "nregfix.csv", delimiter=",", skip_header=1)
    y, X, Z = nreg[:, 0], nreg[:, 1:3], nreg[:, 3:4]
    k, d = 3, X.shape[1]
    log("flexmix beside mixreg on NregFix with a gate on w")
    fitted = MixtureOfLinearRegressions(k, gating=True, standard_errors=True, random_state=0).fit(
        X, y, concomitant=Z
    )
    with tempfile.TemporaryDirectory() as folder:
        data, out = Path(folder) / "gated_in.csv", Path(folder) / "gated_out.csv"
        header = ",".join(["y", "x1", "x2", "z1", *(f"p{j + 1}" for j in range(k))])
        np.savetxt(
            data,
            np.column_stack([y, X, Z, gated_posteriors(fitted, X, y, Z)]),
            fmt="%.17g",
            delimiter=",",
            header=header,
            comments="",
        )
        script = R_SCRIPT.with_name("refit_gated_standard_errors.R")
        subprocess.run(["Rscript", str(script), str(data), str(d), str(out)], check=True)
        rows = np.genfromtxt(out, delimiter=",", names=True, dtype=None, encoding="utf-8")
    names = [str(name).strip('"') for name in rows["name"]]
    values = dict(zip(names, zip(rows["estimate"], rows["std_error"], strict=True), strict=True))
    ours: list[float] = []
    theirs: list[float] = []
    labels: list[str] = []
    for j in range(k):
        prefix = f"model.1_Comp.{j + 1}_"
        for column in range(d):
            ours.append(fitted.coef_se_[j, column])
            theirs.append(values[f"{prefix}coef.x{column + 1}"][1])
            labels.append(f"line {j}, x{column + 1}")
        ours.append(fitted.intercept_se_[j])
        theirs.append(values[f"{prefix}coef.(Intercept)"][1])
        labels.append(f"line {j}, (Intercept)")
        # flexmix's parameter is log(sigma): se(log sigma) = se(s^2) / (2 s^2).
        ours.append(fitted.noise_variance_se_[j] / (2 * fitted.noise_variance_[j]))
        theirs.append(values[f"{prefix}log(sigma)"][1])
        labels.append(f"line {j}, log(sigma)")
    for j in range(1, k):
        ours.append(fitted.gate_intercept_se_[j])
        theirs.append(values[f"concomitant_Comp.{j + 1}.(Intercept)"][1])
        labels.append(f"gate {j}, (Intercept)")
        ours.append(fitted.gate_coef_se_[j, 0])
        theirs.append(values[f"concomitant_Comp.{j + 1}.z1"][1])
        labels.append(f"gate {j}, w")
    ratios = np.asarray(ours, dtype=np.float64) / np.asarray(theirs, dtype=np.float64)
    deviation = float(np.max(np.abs(ratios - 1)))
    report.add(
        "Gated fit on NregFix (lines y ~ x1 + x2, gate ~ w, k = 3): mixreg SE / flexmix SE "
        f"(`refit` of the concomitant model); log-likelihood mixreg "
        f"{fitted.log_likelihood_:.6f} / flexmix {float(values['logLik'][0]):.6f}"
    )
    report.table(
        ["parameter", "mixreg SE", "flexmix SE", "ratio"],
        [
            [label, f"{a:.5g}", f"{float(b):.5g}", f"{r:.4f}"]
            for label, a, b, r in zip(labels, ours, theirs, ratios, strict=True)
        ],
    )
    report.target(
        "gated SEs beside flexmix::refit (NregFix, gate ~ w)",
        f"within {SE_AGREEMENT:.0%}",
        f"largest difference {100 * deviation:.2f} %",
        deviation <= SE_AGREEMENT,
    )


COVERAGE_LINES = {
    2: (np.array([[3.0, -1.0], [-3.0, 1.0]]), np.array([0.0, 5.0])),
    3: (np.array([[3.0, -1.0], [-3.0, 1.0], [0.0, 4.0]]), np.array([0.0, 5.0, -6.0])),
}


def coverage(k: int, n: int, replications: int, seed: int) -> tuple[float, int]:
    """Share of 95 % intervals (coefficients and intercepts) that hold the true lines."""
    coef, intercept = COVERAGE_LINES[k]
    truth = np.column_stack([coef, intercept])
    rng = np.random.default_rng(seed)
    covered = []
    for _ in range(replications):
        X, y = realizable(rng, n, coef, intercept, 1.0)
        fitted = MixtureOfLinearRegressions(
            k, algorithm="am-classic", n_init=5, standard_errors=True, random_state=rng
        ).fit(X, y)
        intervals = fitted.confidence_intervals(0.95)
        order = match_lines(truth, np.column_stack([fitted.ml_coef_, fitted.ml_intercept_]))
        low = np.column_stack([intervals["coef"][order, :, 0], intervals["intercept"][order, 0]])
        high = np.column_stack([intervals["coef"][order, :, 1], intervals["intercept"][order, 1]])
        covered.append(((low <= truth) & (truth <= high)).ravel())
    flat = np.concatenate(covered)
    return float(flat.mean()), flat.size


def measure_coverage(report: Report, replications: int) -> None:
    rows = []
    for k in (2, 3):
        for n in (500, 5000):
            log(f"coverage, k = {k}, n = {n}, {replications} replications")
            started = time.perf_counter()
            rate, count = coverage(k, n, replications, seed=100 * k + n)
            sd = np.sqrt(0.95 * 0.05 / replications)
            met = COVERAGE_RANGE[0] <= rate <= COVERAGE_RANGE[1]
            rows.append(
                [
                    str(k),
                    f"{n:,}",
                    str(replications),
                    str(count),
                    f"{100 * rate:.2f} %",
                    f"{time.perf_counter() - started:.0f} s",
                ]
            )
            report.target(
                f"coverage k = {k}, n = {n:,}",
                f"{COVERAGE_RANGE[0]:.0%} - {COVERAGE_RANGE[1]:.0%}",
                f"{100 * rate:.2f} % (one interval's binomial sd {100 * sd:.1f} %)",
                met,
            )
    report.add(
        "Coverage of the 95 % Wald intervals of every coefficient and intercept "
        "(separated lines, noise sd 1, fits by am-classic with 5 starts):"
    )
    report.table(["k", "n", "replications", "intervals", "covered", "time"], rows)


# The standard errors of a fit of 10^6 rows, timed with whichever mixreg is first on the path
# (one BLAS thread, as the estimator computes them): wall and CPU seconds and the errors.
_SE_AT_SCALE = """
import json, sys, time
import numpy as np
from mixreg import MixtureOfLinearRegressions
from mixreg._scaling import Scaling
from mixreg._loss import single_threaded_blas

rng = np.random.default_rng(7)
n, d, k = 10**6, 20, 4
coef = 3 * rng.standard_normal((k, d))
intercept = 5.0 * np.arange(k)
X = rng.standard_normal((n, d))
lines = rng.integers(0, k, size=n)
y = np.einsum("ij,ij->i", X, coef[lines]) + intercept[lines] + rng.standard_normal(n)
began = time.perf_counter()
fitted = MixtureOfLinearRegressions(
    k, algorithm="am-classic", init=np.column_stack([coef, intercept]), random_state=0
).fit(X, y)
fit_seconds = time.perf_counter() - began
scaling, Z, y_scaled = Scaling.of(X, y, True)
theta = scaling.to_scaled(np.column_stack([fitted.coef_, fitted.intercept_]))
with single_threaded_blas():
    wall, cpu = time.perf_counter(), time.process_time()
    fitted._set_standard_errors(Z, y_scaled, theta, scaling, None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({
    "wall": wall, "cpu": cpu, "fit": fit_seconds,
    "se": np.sqrt(np.diag(fitted.covariance_)).tolist(),
}))
"""


def _standard_errors_at_scale(code: Path) -> dict[str, Any]:
    """Seconds and standard errors of :data:`_SE_AT_SCALE` run with the code in ``code``."""
    answer = subprocess.run(
        [sys.executable, "-c", _SE_AT_SCALE],
        # In the code's folder: ``-c`` puts the working directory first on the path.
        cwd=code,
        env={"PYTHONPATH": str(code), "OPENBLAS_NUM_THREADS": "1", "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(answer.stdout)
    return result


def measure_speed(report: Report, before: Path | None, rounds: int) -> None:
    """Standard errors at 10^6 rows with today's code (and, given ``before``, the code in that
    folder, alternating round by round so a change of the machine's load hits both alike), and
    a bootstrap before (EM to the tight tolerance) and after (the Newton finish)."""
    codes = {"today": REPO_ROOT, **({} if before is None else {"before": before})}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in codes}
    for round_ in range(rounds):
        for label, code in codes.items():
            log(f"speed, round {round_ + 1}: standard errors at 10^6 rows, {label}'s code")
            runs[label].append(_standard_errors_at_scale(code))
    fastest = {label: min(run["wall"] for run in results) for label, results in runs.items()}
    cpu = {label: min(run["cpu"] for run in results) for label, results in runs.items()}
    rows = [
        [
            label,
            " / ".join(f"{run['wall']:.2f}" for run in results),
            " / ".join(f"{run['cpu']:.2f}" for run in results),
        ]
        for label, results in runs.items()
    ]
    report.add(
        f"Standard errors of a fit of n = 10^6, d = 20, k = 4 (EM polish from the fitted lines "
        f"and the information; the estimator's step alone, one BLAS thread), {rounds} "
        "alternating round(s) of each code, each in its own process:",
        "",
    )
    report.table(["code", "wall seconds per round", "CPU seconds per round"], rows)
    if before is not None:
        today_se = np.asarray(runs["today"][0]["se"])
        before_se = np.asarray(runs["before"][0]["se"])
        agreement = float(np.max(np.abs(today_se / before_se - 1.0)))
        report.add(
            "Today / before (fastest of the rounds): "
            f"wall {fastest['today'] / fastest['before']:.2f}x, "
            f"CPU {cpu['today'] / cpu['before']:.2f}x. "
            f"Largest relative difference of the standard errors: {agreement:.1e}.",
        )
    report.add("")
    report.target(
        "SEs, n = 10^6, d = 20, k = 4",
        f"< {SE_SECONDS:.0f} s",
        f"{fastest['today']:.1f} s wall, {cpu['today']:.1f} s CPU"
        + (
            ""
            if before is None
            else f" (before: {fastest['before']:.1f} s wall, {cpu['before']:.1f} s CPU)"
        ),
        fastest["today"] < SE_SECONDS,
    )
    rng = np.random.default_rng(7)
    n, d, k = 5000, 5, 3
    coef = 3 * rng.standard_normal((k, d))
    X, y = realizable(rng, n, coef, np.arange(k, dtype=np.float64) * 6.0, 1.0)
    fitted = MixtureOfLinearRegressions(k, random_state=0).fit(X, y)
    log("speed: a 200-replicate bootstrap of 5,000 rows, before and after")
    scaling, Z, y_scaled = Scaling.of(X, y, True)
    lines = scaling.to_scaled(np.column_stack([fitted.coef_, fitted.intercept_]))
    with single_threaded_blas():
        mixture = maximum_likelihood_polish(Z, y_scaled, lines).params
        began = time.perf_counter()
        bootstrap_replicates(
            Z,
            y_scaled,
            mixture,
            n_bootstrap=200,
            kind="parametric",
            rng=np.random.default_rng(0),
            newton_finish=False,
        )
        bootstrap_before = time.perf_counter() - began
    began = time.perf_counter()
    fitted.bootstrap(X, y, n_bootstrap=200, kind="parametric", random_state=0)
    seconds = time.perf_counter() - began
    report.target(
        "bootstrap, 200 replicates, n = 5,000, d = 5, k = 3",
        f"< {BOOTSTRAP_SECONDS:.0f} s",
        f"{seconds:.1f} s (before: {bootstrap_before:.1f} s)",
        seconds < BOOTSTRAP_SECONDS,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.standard_errors",
        description="Standard errors beside flexmix::refit, coverage and speed; writes its "
        "section of bench/RESULTS.md.",
    )
    parser.add_argument("--replications", type=int, default=400)
    parser.add_argument("--skip", nargs="*", default=[], choices=["flexmix", "coverage", "speed"])
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--before",
        type=Path,
        help="a copy of earlier code (git archive <commit> mixreg | tar -x -C DIR) whose "
        "standard errors at 10^6 rows are timed beside today's",
    )
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the timing")
    args = parser.parse_args(argv)
    report = Report()
    command = "python -m bench.standard_errors" + "".join(
        f" {arg}" for arg in (argv if argv is not None else sys.argv[1:])
    )
    report.add("## Standard errors", "")
    reason = r_unavailable_reason()
    report.add(*machine_lines(command, also=None if reason else r_versions()), "")
    if "flexmix" not in args.skip:
        if reason:
            report.add(f"flexmix: not run ({reason}).", "")
        else:
            with tempfile.TemporaryDirectory() as folder:
                subprocess.run(["Rscript", "-e", EXPORT_R_DATA, folder], check=True)
                compare_with_flexmix(report, Path(folder))
                compare_gated_with_flexmix(report, Path(folder))
    if "coverage" not in args.skip:
        measure_coverage(report, args.replications)
    if {"flexmix", "coverage"} - set(args.skip):
        report.add(f"Load average (1, 5, 15 min) at the end: {load_average()}", "")
        report.targets_table(report.targets)
        write_section(args.output, SECTION, "\n".join(report.lines))
    if "speed" not in args.skip:
        # Its own section: the timings can be re-run alone, on a quieter machine.
        speed = Report()
        speed.add("### Standard errors: speed", "")
        speed.add(*machine_lines(command), "")
        measure_speed(speed, args.before, args.rounds)
        speed.add(f"Load average (1, 5, 15 min) at the end: {load_average()}", "")
        speed.targets_table(speed.targets)
        write_section(args.output, SPEED_SECTION, "\n".join(speed.lines))


if __name__ == "__main__":
    main()
