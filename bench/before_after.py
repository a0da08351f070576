"""The algorithm speed rows of issue 34, measured for the code before a change and after it.

Each row is timed exactly as ``python -m bench.algorithms`` times it (section b: the
estimator beside the paper-style reference, best of 3 fits taking turns, BLAS limited to one
thread; section c: gradient AM beside its unavoidable products), once with this checkout's
``mixreg`` and once with the ``mixreg`` of an earlier revision (extracted with ``git archive``
into a temporary directory). The two run in separate processes, taking turns for ``--rounds``
rounds, so a burst of load on a shared machine slows both; each process reports the ratio it
measured against its own anchor (the reference, or the products), and the ratios are what to
compare. The section ``algorithms-before-after`` of ``bench/RESULTS.md`` is rewritten (with
``--only``, the section of that group: ``algorithms-before-after-speed`` or ``-am``).

Usage: ``python -m bench.before_after --revision f2207fa [--rounds 2] [--only speed|am]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.sections import load_average, log, write_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "algorithms-before-after"

# Run in a child process whose sys.path starts with the tree under test (its mixreg), and
# this checkout's bench package after it: the same timing code for both trees.
_SPEED_CHILD = """
import json
from functools import partial
import threadpoolctl
from bench.algorithms import _best_times, paper_datasets
from bench.reference import reference_subsample
from mixreg import MixtureOfLinearRegressions
rows = {}
datasets = {data.name: data for data in paper_datasets()}
with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
    for name in ("Friedman 1", "Mixture of two regressions"):
        data = datasets[name]
        for base, h in (("ls", 1000), ("ransac", 100)):
            reference = partial(
                reference_subsample, data.X_train, data.y_train, 2, subsample_size=150,
                n_partitions=h, base=base, random_state=0,
            )
            estimator = MixtureOfLinearRegressions(
                n_components=2, algorithm="subsample", subsample_size=150, n_partitions=h,
                base=base, random_state=0,
            )
            fit = partial(estimator.fit, data.X_train, data.y_train)
            reference_s, estimator_s = _best_times([reference, fit], 3)
            rows[f"{name}, {base}, h = {h}"] = [reference_s, estimator_s]
print(json.dumps(rows))
"""

_AM_CHILD = """
import json
from bench.algorithms import _time_am_against_products
from mixreg.datasets import make_realizable
X, y, *_ = make_realizable(1_000_000, 20, 4, noise=0.5, random_state=0)
rows = {}
for step in (0.1, "auto"):
    timing = _time_am_against_products(X, y, 4, step)
    rows[f"gradient AM, step {step}"] = [timing.products_seconds, timing.am_seconds]
print(json.dumps(rows))
"""


def _extract(revision: str, into: Path) -> None:
    """The ``mixreg`` package of ``revision`` under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "mixreg"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


# With --clock cpu, the child's timings read its own CPU time instead of the wall clock: on a
# machine so oversubscribed that a process gets a few percent of a core, wall times of short
# fits measure the scheduler's luck more than the code.
_CPU_CLOCK = """
import time
import bench.algorithms
bench.algorithms.time = type("CpuClock", (), {"perf_counter": staticmethod(time.process_time)})
"""


def _run_child(code: str, tree: Path, clock: str = "wall") -> dict[str, list[float]]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    if clock == "cpu":
        code = _CPU_CLOCK + code
    output = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        cwd=tree,
        env=environment,
    ).stdout
    result: dict[str, list[float]] = json.loads(output.strip().splitlines()[-1])
    return result


def measure(
    revision: str, rounds: int, children: Sequence[str], clock: str = "wall"
) -> list[dict[str, object]]:
    """Every round: each child program with the code after, then before (in that order)."""
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as before_dir:
        before = Path(before_dir)
        _extract(revision, before)
        for round_number in range(1, rounds + 1):
            for child in children:
                for label, tree in (("after", ROOT), ("before", before)):
                    log(f"round {round_number}: {label}, load {load_average()}")
                    rows = _run_child(child, tree, clock)
                    runs.append({"round": round_number, "code": label, "rows": rows})
    return runs


def report(
    runs: list[dict[str, object]], revision: str, command: str, title: str = "", clock: str = "wall"
) -> str:
    """Markdown: per row, each run's anchor seconds, fit seconds and ratio."""
    lines = [
        f"## Algorithm speed before and after (issue 34){title}",
        "",
        f"Command: `{command}`; 'before' is `mixreg` at revision {revision}, 'after' this "
        "checkout. Each row is timed as `python -m bench.algorithms` times it (section b: the "
        "paper-style reference beside the estimator, best of 3 taking turns, BLAS on one "
        "thread; section c: gradient AM's one fit beside 100 x its two products at their "
        "faster layout). The codes run in separate processes taking turns, so read the "
        "ratios, each measured against its own anchor in its own process: the machine is "
        f"shared (load average at the end: {load_average()}), so absolute seconds are "
        "inflated and vary between rounds. The speed-up of section b is anchor over fit "
        "(higher is better); for gradient AM the ratio is fit over products (lower is "
        "better). The fits return the same lines before and after, bit for bit "
        "(tests/mixreg/test_ransac.py, tests/mixreg/test_am_pending_step.py). Clock: "
        + ("wall." if clock == "wall" else "each process's CPU time (`time.process_time`)."),
        "",
        "| row | round | code | anchor s | fit s | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        rows = run["rows"]
        assert isinstance(rows, dict)
        for name, (anchor, fit) in rows.items():
            ratio = anchor / fit if not name.startswith("gradient AM") else fit / anchor
            lines.append(
                f"| {name} | {run['round']} | {run['code']} | {anchor:.3f} | {fit:.4f} "
                f"| {ratio:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.before_after", description=__doc__)
    parser.add_argument("--revision", required=True, help="git revision of the 'before' code")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", choices=["speed", "am"], help="one group of rows only")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="time with the wall clock (as bench.algorithms) or the process's CPU time",
    )
    args = parser.parse_args(argv)
    children = {"speed": [_SPEED_CHILD], "am": [_AM_CHILD]}.get(
        args.only or "", [_SPEED_CHILD, _AM_CHILD]
    )
    command = "python -m bench.before_after " + " ".join(sys.argv[1:] if argv is None else argv)
    runs = measure(args.revision, args.rounds, children, args.clock)
    section = SECTION if args.only is None else f"{SECTION}-{args.only}"
    write_section(
        args.output,
        section,
        report(
            runs,
            args.revision,
            command,
            {"speed": ": subsample", "am": ": gradient AM"}.get(args.only or "", ""),
            args.clock,
        ),
    )
    log(f"wrote {args.output}")


if __name__ == "__main__":
    main()
