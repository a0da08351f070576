"""Beyond one machine's memory: fits streamed over row chunks on disk, embedded and on Dask.

``python -m bench.streamed`` (``make bench-streamed``) writes the section "streamed" of
``bench/RESULTS.md``. A realizable mixture (k = 4, d = 20, noise 0.1) is written as
memory-mapped ``.npy`` row chunks; each fit runs in a fresh process (so its peak RSS is its own):

- ``streamed``: ``MixtureOfLinearRegressions().fit(NpyChunks(directory))``, every pass reading
  one chunk at a time in the fitting process;
- ``in-memory``: the chunks concatenated and fitted as arrays (today's path), at the sizes
  given by ``--in-memory-rows``;
- ``dask-N``: the same streamed fit on a ``LocalCluster`` of N worker processes (one thread
  each), every task reading its own chunk (:class:`mixreg._dask.DaskChunks`);
- ``oracle``: the true lines polished on all rows (classical AM, then exact refits), over the
  same chunks: the min-loss a fit should reach.

Reported: wall time, passes over the rows, peak RSS of the fitting process, the training
min-loss against the oracle's, the largest relative difference of the lines to the embedded
streamed fit (and to the in-memory fit), and Dask's cost of one pass of empty tasks.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from bench.sections import Report, log, machine_lines, write_section
from mixreg import MixtureOfLinearRegressions, NpyChunks
from mixreg.datasets import make_realizable

SECTION = "streamed"
DEFAULT_OUTPUT = Path(__file__).with_name("RESULTS.md")
N_COMPONENTS, N_FEATURES, NOISE, SEED = 4, 20, 0.1, 0


def write_mixture(
    directory: Path,
    n_rows: int,
    chunk_rows: int,
    *,
    n_components: int = N_COMPONENTS,
    n_features: int = N_FEATURES,
    seed: int = SEED,
) -> None:
    """Rows of a realizable mixture as ``.npy`` chunks, one chunk in memory at a time; the
    true lines are saved beside them (``lines.npz``)."""
    _, _, coef, intercept, _ = make_realizable(
        n_samples=n_components,
        n_features=n_features,
        n_components=n_components,
        noise=NOISE,
        random_state=seed,
    )
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / "lines.npz", coef=coef, intercept=intercept)
    for index, start in enumerate(range(0, n_rows, chunk_rows)):
        rows = min(chunk_rows, n_rows - start)
        rng = np.random.default_rng([seed, index])
        X = rng.standard_normal((rows, n_features))
        labels = rng.integers(0, n_components, rows)
        y = (X @ coef.T + intercept)[np.arange(rows), labels] + NOISE * rng.standard_normal(rows)
        np.save(directory / f"X_{index}.npy", X)
        np.save(directory / f"y_{index}.npy", y)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _oracle(directory: Path) -> dict[str, Any]:
    """The true lines polished on all rows: their min-loss, in the caller's units."""
    from mixreg._streamed import StreamedFit

    lines = np.load(directory / "lines.npz")
    rows = StreamedFit(NpyChunks(directory), fit_intercept=True)
    start = rows.scaling.to_scaled(np.column_stack([lines["coef"], lines["intercept"]]))
    polished = rows.polish(start[None], max_iter=100, tol=1e-6, deadline=None, callback=None)
    theta = rows.refit_exactly_until_stable(polished.thetas[0], None)
    coef, intercept = rows.scaling.to_caller(theta)
    _, _, _, loss = rows.summary(theta, coef, intercept)
    return {"train_loss": loss, "coef": coef.tolist(), "intercept": intercept.tolist()}


def _empty_pass_seconds(client: Any, n_chunks: int, repeats: int = 10) -> float:
    """Wall time of one pass of ``n_chunks`` tasks that do nothing: Dask's cost per pass."""
    started = time.perf_counter()
    for _ in range(repeats):
        client.gather(client.map(int, range(n_chunks), pure=False))
    return (time.perf_counter() - started) / repeats


def run_one(mode: str, directory: Path) -> dict[str, Any]:
    """One fit (or the oracle) in this process; what ``main`` reports of it. A fit's warnings
    (a line with few rows in a bad start) are not what is measured."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run_one(mode, directory)


def _run_one(mode: str, directory: Path) -> dict[str, Any]:
    if mode == "oracle":
        started = time.perf_counter()
        result = _oracle(directory)
        return {**result, "seconds": time.perf_counter() - started, "peak_rss_mib": _peak_rss_mib()}
    n_components = int(np.load(directory / "lines.npz")["coef"].shape[0])
    model = MixtureOfLinearRegressions(n_components=n_components, random_state=SEED)
    source = NpyChunks(directory)
    extra: dict[str, Any] = {}
    if mode == "in-memory":
        X = np.concatenate([source.read(i).X for i in range(len(source.chunk_rows))])
        y = np.concatenate([source.read(i).y for i in range(len(source.chunk_rows))])
        started = time.perf_counter()
        model.fit(X, y)
    elif mode == "streamed":
        started = time.perf_counter()
        model.fit(source)
    elif mode.startswith("dask-"):
        from distributed import Client, LocalCluster

        from mixreg._dask import DaskChunks

        workers = int(mode.split("-", 1)[1])
        with (
            LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            Client(cluster) as client,
        ):
            client.wait_for_workers(workers)
            extra["empty_pass_seconds"] = _empty_pass_seconds(client, len(source.chunk_rows))
            started = time.perf_counter()
            model.fit(DaskChunks(source, client))
            seconds = time.perf_counter() - started
        return _summary(model, seconds, extra)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return _summary(model, time.perf_counter() - started, extra)


def _summary(
    model: MixtureOfLinearRegressions, seconds: float, extra: dict[str, Any]
) -> dict[str, Any]:
    return {
        "seconds": seconds,
        "passes": getattr(model, "passes_", None),
        "peak_rss_mib": _peak_rss_mib(),
        "train_loss": float(model.train_loss_),
        "coef": model.coef_.tolist(),
        "intercept": model.intercept_.tolist(),
        **extra,
    }


def run_in_process(mode: str, directory: Path) -> dict[str, Any]:
    """:func:`run_one` in a fresh Python process (its own peak RSS)."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.streamed", "--one", mode, "--directory", str(directory)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def lines_difference(first: dict[str, Any], second: dict[str, Any]) -> float:
    """Largest difference of two fits' lines relative to the lines' largest value."""
    a = np.column_stack([first["coef"], first["intercept"]])
    b = np.column_stack([second["coef"], second["intercept"]])
    return float(np.abs(a - b).max() / np.abs(b).max())


def measure(
    rows: int, chunk_rows: int, modes: list[str], workdir: Path
) -> dict[str, dict[str, Any]]:
    """Write the rows, run every mode (and the oracle) in its own process, delete the rows."""
    directory = workdir / f"rows_{rows}"
    write_mixture(directory, rows, chunk_rows)
    try:
        results = {}
        for mode in ["oracle", *modes]:
            log(f"{rows:,} rows: {mode}")
            results[mode] = run_in_process(mode, directory)
        return results
    finally:
        shutil.rmtree(directory)


def report_lines(all_results: dict[int, dict[str, dict[str, Any]]], chunk_rows: int) -> Report:
    report = Report()
    report.add(
        "## Beyond one machine's memory: fits streamed over row chunks",
        "",
        f"A realizable mixture (k = {N_COMPONENTS}, d = {N_FEATURES}, noise {NOISE}) stored as "
        f"memory-mapped `.npy` row chunks of {chunk_rows:,} rows; each fit (default `auto`, "
        f"seed {SEED}) in a fresh process. *oracle*: the true lines polished on all rows. "
        "*lines vs streamed*: largest difference of the lines to the embedded streamed fit's, "
        "relative to the largest coefficient. The machine is shared with other people's work: "
        "wall times are as loaded as the load average says, ratios were measured side by side.",
        "",
    )
    table_rows = []
    for rows, results in all_results.items():
        oracle = results["oracle"]["train_loss"]
        reference = results.get("streamed")
        for mode, result in results.items():
            if mode == "oracle":
                continue
            table_rows.append(
                [
                    f"{rows:,}",
                    mode,
                    f"{result['seconds']:.1f}",
                    "" if result["passes"] is None else str(result["passes"]),
                    f"{result['peak_rss_mib']:.0f}",
                    f"{result['train_loss'] / oracle:.6f}",
                    "" if reference is None else f"{lines_difference(result, reference):.1e}",
                    f"{result['empty_pass_seconds'] * 1e3:.0f}"
                    if "empty_pass_seconds" in result
                    else "",
                ]
            )
    report.table(
        [
            "rows",
            "fit",
            "wall s",
            "passes",
            "peak RSS MiB",
            "min-loss / oracle",
            "lines vs streamed",
            "empty Dask pass ms",
        ],
        table_rows,
    )
    for rows, results in all_results.items():
        ratios = []
        if "in-memory" in results and "streamed" in results:
            streamed, in_memory = results["streamed"], results["in-memory"]
            ratios.append(
                f"streamed / in-memory wall time "
                f"{streamed['seconds'] / in_memory['seconds']:.2f}, peak RSS "
                f"{streamed['peak_rss_mib'] / in_memory['peak_rss_mib']:.2f}"
            )
        if "dask-1" in results and "dask-2" in results:
            ratios.append(
                f"2-worker speed-up over 1 worker "
                f"{results['dask-1']['seconds'] / results['dask-2']['seconds']:.2f}x"
            )
        if ratios:
            report.add(f"- {rows:,} rows: " + "; ".join(ratios) + ".")
    missing = [f"{size:,}" for size in (10_000_000, 100_000_000) if size not in all_results]
    if missing:
        report.add(f"- Not measured in this run: {', '.join(missing)} rows.")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--chunk-rows", type=int, default=1 << 16)
    parser.add_argument("--in-memory-rows", type=int, nargs="*", default=[1_000_000])
    parser.add_argument("--dask-rows", type=int, nargs="*", default=[10_000_000])
    parser.add_argument("--dask-workers", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--directory", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.directory)))
        return
    command = "python -m bench.streamed " + " ".join(argv if argv is not None else sys.argv[1:])
    head = machine_lines(command, packages=("numpy", "dask", "distributed"))
    all_results = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        for rows in args.rows:
            modes = ["streamed"]
            if rows in args.in_memory_rows:
                modes.append("in-memory")
            if rows in args.dask_rows:
                modes += [f"dask-{workers}" for workers in args.dask_workers]
            all_results[rows] = measure(rows, args.chunk_rows, modes, Path(workdir))
    report = report_lines(all_results, args.chunk_rows)
    lines = [*head, "", *report.lines]
    write_section(args.output, SECTION, "\n".join(lines))
    print(json.dumps({str(rows): results for rows, results in all_results.items()}, indent=1))


if __name__ == "__main__":
    main()
