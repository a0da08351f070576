"""Sample weights and groups leave the plain fit as fast as it was: the default fit (``auto``,
k = 3) of 5,000 x 5 Friedman rows with the code before weights and with today's, and today's
weighted and grouped fits of the same rows beside it.

``python -m bench.weights --before DIR`` times the fits of the code in ``DIR`` (a copy of the
repository before sample weights, e.g. ``git archive <commit> mixreg | tar -x -C DIR``) in a
child process beside today's; the section ``sample-weights`` of bench/RESULTS.md is written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.sections import Report, load_average, log, machine_lines, write_section

SECTION = "sample-weights"
DEFAULT_OUTPUT = Path(__file__).with_name("RESULTS.md")
REPO = Path(__file__).resolve().parent.parent

# CPU seconds of default fits with whichever mixreg is first on the path; "weighted" and
# "grouped" only exist in today's code.
_FITS = """
import json, sys, time
import numpy as np
from mixreg import MixtureOfLinearRegressions
from mixreg.datasets import make_friedman

kind, rounds = sys.argv[1], int(sys.argv[2])
X, y = make_friedman(1, n_train=5000, n_test=1, random_state=0)[:2]
X = X[:, :5]
rng = np.random.default_rng(0)
options = {
    "plain": {},
    "weighted": {"sample_weight": rng.integers(1, 4, size=len(y)).astype(float)},
    "grouped": {"groups": rng.integers(0, 500, size=len(y))},
}[kind]
seconds, losses = [], []
for _ in range(rounds):
    started = time.process_time()
    model = MixtureOfLinearRegressions(3, random_state=0).fit(X, y, **options)
    seconds.append(time.process_time() - started)
    losses.append(model.train_loss_)
print(json.dumps({"seconds": seconds, "loss": losses[-1]}))
"""


def _fits(code: Path, kind: str, rounds: int) -> dict[str, object]:
    """CPU seconds and the training min-loss of ``rounds`` fits of ``kind`` with ``code``."""
    answer = subprocess.run(
        [sys.executable, "-c", _FITS, kind, str(rounds)],
        env={"PYTHONPATH": str(code), "OPENBLAS_NUM_THREADS": "1", "PATH": ""},
        # `python -c` puts its working directory first on sys.path: run it in ``code``, or it
        # would import this checkout's mixreg whatever PYTHONPATH says.
        cwd=code,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(answer.stdout)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.weights",
        description="Time the default fit before and after sample weights; write the "
        "sample-weights section of bench/RESULTS.md.",
    )
    parser.add_argument(
        "--before", type=Path, required=True, help="a copy of the code before sample weights"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    command = " ".join(["python -m bench.weights", *(sys.argv[1:] if argv is None else argv)])
    report = Report()
    report.add("## Sample weights and groups: the plain default fit before and after", "")
    report.add("Machine and run:", "", *machine_lines(command), "")
    runs: dict[str, list[float]] = {"before": [], "after": [], "weighted": [], "grouped": []}
    losses: dict[str, float] = {}
    # Alternating rounds, so a change in the machine's load hits both codes alike.
    for round_ in range(2):
        for label, code, kind in (
            ("before", args.before, "plain"),
            ("after", REPO, "plain"),
            ("weighted", REPO, "weighted"),
            ("grouped", REPO, "grouped"),
        ):
            log(f"round {round_ + 1}: {label}")
            result = _fits(code, kind, args.rounds)
            runs[label] += list(result["seconds"])  # type: ignore[call-overload]
            losses[label] = float(result["loss"])  # type: ignore[arg-type]
    medians = {label: statistics.median(seconds) for label, seconds in runs.items()}
    fastest = {label: min(seconds) for label, seconds in runs.items()}
    ratio = medians["after"] / medians["before"]
    fastest_ratio = fastest["after"] / fastest["before"]
    report.targets_table(
        [
            (
                "plain default fit 5,000 x 5, k = 3, today / before (median; fastest CPU s)",
                "≤ 1.05x, same lines",
                f"{ratio:.3f}x; {fastest_ratio:.3f}x",
                min(ratio, fastest_ratio) <= 1.05 and losses["after"] == losses["before"],
            )
        ]
    )
    report.add(
        f"CPU seconds of `MixtureOfLinearRegressions(3, random_state=0).fit` on "
        f"`make_friedman(1, n_train=5000)` (first 5 features), {len(runs['before'])} fits of "
        "each in two alternating rounds, one BLAS thread. Weighted: integer weights 1-3; "
        "grouped: 500 random groups of about 10 rows.",
        "",
    )
    labels = {
        "before": "plain, code before sample weights",
        "after": "plain, today's code",
        "weighted": "weighted, today's code",
        "grouped": "grouped, today's code",
    }
    report.table(
        ["fit", "median CPU s", "fastest", "slowest", "training min-loss"],
        [
            [
                text,
                f"{medians[label]:.3f}",
                f"{fastest[label]:.3f}",
                f"{max(runs[label]):.3f}",
                f"{losses[label]:.6g}",
            ]
            for label, text in labels.items()
        ],
    )
    report.add(f"Load average at the end: {load_average()}.", "")
    write_section(args.output, SECTION, "\n".join(report.lines))
    log(f"wrote the {SECTION} section of {args.output}")


if __name__ == "__main__":
    main()
