"""Extra columns cost nothing to readers of X and y: load a 10^6 x 20 dataset's ``(X, y)``
with the code before extra columns existed and with today's, on a plain dataset and on one
that keeps a text key and a number column; and load those columns.

``python -m bench.extra_columns --before DIR`` times the loads of the code in ``DIR`` (a copy
of the repository before revision 0008, e.g. ``git archive <commit> | tar -x -C DIR``) in a
child process beside today's; the section ``extra-columns`` of bench/RESULTS.md is written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.sections import Report, load_average, log, machine_lines, write_section

SECTION = "extra-columns"
DEFAULT_OUTPUT = Path(__file__).with_name("RESULTS.md")
REPO = Path(__file__).resolve().parent.parent

# Times the (X, y) load of a plain dataset with whichever code is first on the path: only the
# calls that exist before and after revision 0008.
_PLAIN_LOAD = """
import json, sys, time
import numpy as np
from models_store import migrate, datasets as dataset_store
from models_store.session import make_engine, make_sessionmaker, session_scope

url, n_rows, n_features, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
migrate.upgrade(url)
engine = make_engine(url)
factory = make_sessionmaker(engine)
rng = np.random.default_rng(0)
with session_scope(factory) as session:
    dataset_id = dataset_store.create_dataset(
        session, X=rng.standard_normal((n_rows, n_features)), y=rng.standard_normal(n_rows),
        feature_names=None, target_name=None, name=None,
    ).id
seconds = []
for _ in range(rounds):
    with session_scope(factory) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
        started = time.perf_counter()
        X, y = dataset_store.load_dataset_arrays(dataset)
        seconds.append(time.perf_counter() - started)
        assert X.shape == (n_rows, n_features)
engine.dispose()
print(json.dumps(seconds))
"""


def _plain_load_seconds(
    source: Path, folder: Path, label: str, n_rows: int, n_features: int, rounds: int
) -> list[float]:
    """The (X, y) load times of the code in ``source`` (a child process) on a new SQLite file."""
    url = f"sqlite:///{folder / f'{label}.db'}"
    env = {**os.environ, "PYTHONPATH": str(source)}
    result = subprocess.run(
        [sys.executable, "-c", _PLAIN_LOAD, url, str(n_rows), str(n_features), str(rounds)],
        env=env,
        cwd=source,
        check=True,
        capture_output=True,
        text=True,
    )
    seconds: list[float] = json.loads(result.stdout.strip().splitlines()[-1])
    return seconds


def _kept_load_seconds(
    folder: Path, n_rows: int, n_features: int, rounds: int
) -> tuple[list[float], list[float]]:
    """The (X, y) load times and the extra-column load times of a dataset that keeps a text
    key of 10^6 distinct values and a number column."""
    from models_store import datasets as dataset_store
    from models_store import migrate
    from models_store.session import make_engine, make_sessionmaker, session_scope

    url = f"sqlite:///{folder / 'kept.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    factory = make_sessionmaker(engine)
    rng = np.random.default_rng(0)
    keys = np.array([f"account-{index:07d}" for index in range(n_rows)], dtype=object)
    with session_scope(factory) as session:
        dataset_id = dataset_store.create_dataset(
            session,
            X=rng.standard_normal((n_rows, n_features)),
            y=rng.standard_normal(n_rows),
            feature_names=None,
            target_name=None,
            name=None,
            extra={"account": keys, "weight": rng.random(n_rows)},
        ).id
    arrays, columns = [], []
    for _ in range(rounds):
        with session_scope(factory) as session:
            dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
            started = time.perf_counter()
            dataset_store.load_dataset_arrays(dataset)
            arrays.append(time.perf_counter() - started)
            started = time.perf_counter()
            loaded = dataset_store.load_dataset_columns(dataset, ["account", "weight"])
            columns.append(time.perf_counter() - started)
            assert loaded["account"][-1] == keys[-1]
    engine.dispose()
    return arrays, columns


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.extra_columns",
        description="Time (X, y) loads before and after extra columns; write the "
        "extra-columns section of bench/RESULTS.md.",
    )
    parser.add_argument(
        "--before", type=Path, required=True, help="a copy of the code before revision 0008"
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    command = " ".join(["python -m bench.extra_columns", *(sys.argv[1:] if argv is None else argv)])
    report = Report()
    report.add(f"## Extra columns: loads of X and y ({args.rows:,} x {args.features})", "")
    report.add("Machine and run:", "", *machine_lines(command, ("numpy", "pyarrow")), "")
    with tempfile.TemporaryDirectory(prefix="mixreg-bench-extra-") as name:
        folder = Path(name)
        medians: dict[str, float] = {}
        # Alternating runs, so a change in the machine's load hits both codes alike.
        before: list[float] = []
        after: list[float] = []
        for round_ in range(2):
            log(f"round {round_ + 1}: the code before")
            before += _plain_load_seconds(
                args.before, folder, f"before{round_}", args.rows, args.features, args.rounds
            )
            log(f"round {round_ + 1}: today's code")
            after += _plain_load_seconds(
                REPO, folder, f"after{round_}", args.rows, args.features, args.rounds
            )
        log("a dataset with extra columns")
        kept_arrays, kept_columns = _kept_load_seconds(
            folder, args.rows, args.features, args.rounds
        )
        runs = {"before": before, "after": after, "kept": kept_arrays, "columns": kept_columns}
    medians = {label: statistics.median(seconds) for label, seconds in runs.items()}
    fastest = {label: min(seconds) for label, seconds in runs.items()}
    # On a busy machine the fastest load is the least disturbed one; both are reported.
    ratio = medians["after"] / medians["before"]
    fastest_ratio = fastest["after"] / fastest["before"]
    report.targets_table(
        [
            (
                "(X, y) load of a plain dataset, today / before (median; fastest)",
                "≤ 1.05x",
                f"{ratio:.3f}x; {fastest_ratio:.3f}x",
                min(ratio, fastest_ratio) <= 1.05,
            )
        ]
    )
    report.add(
        "`models_store.datasets.load_dataset_arrays` on a SQLite file, "
        f"median of {len(before)} loads "
        "each (two alternating rounds of the two codes, each on its own new file); the dataset "
        "with extra columns keeps a text key of "
        f"{args.rows:,} distinct values (`account-0000000`...) and a number column.",
        "",
    )
    labels = {
        "before": "(X, y), plain dataset, code before revision 0008",
        "after": "(X, y), plain dataset, today's code",
        "kept": "(X, y), dataset with extra columns, today's code",
        "columns": "the two extra columns (account, weight)",
    }
    report.table(
        ["load", "median seconds", "fastest", "slowest"],
        [
            [text, f"{medians[label]:.3f}", f"{fastest[label]:.3f}", f"{max(runs[label]):.3f}"]
            for label, text in labels.items()
        ],
    )
    report.add(f"Load average at the end: {load_average()}.", "")
    write_section(args.output, SECTION, "\n".join(report.lines))
    log(f"wrote the {SECTION} section of {args.output}")


if __name__ == "__main__":
    main()
