"""How fast a fit process starts and how much memory it holds: ``python -m bench.fit_process``.

A fit runs in a child of the worker's fork server (``service.jobs.supervisor``). The child
re-runs the main script of its parent; for ``mixreg serve`` and ``mixreg worker`` that is the
console script, so this module imports what the console script imports, as the real worker's
children do. Each child reports when its target began, the heavy modules it holds and its
resident memory; it then fits a small mixture so that the peak includes a fit's own work.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
import tomllib
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The module of the `mixreg` console script, as pyproject.toml declares it.
CONSOLE_SCRIPT_MODULE = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"][
    "mixreg"
].split(":")[0]
importlib.import_module(CONSOLE_SCRIPT_MODULE)

# Packages a fit has no use for: the web server, the scale-out queue, the terminal UI.
NOT_FOR_A_FIT = ("uvicorn", "fastapi", "starlette", "procrastinate", "rich", "httpx")


def _memory_mb(field: str) -> float:
    """A ``/proc/self/status`` figure (``VmRSS``, ``VmHWM``) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise LookupError(field)


def _probe(report: Queue[dict[str, Any]], n_rows: int) -> None:
    began = time.perf_counter()
    import sys

    import numpy as np

    from mixreg import MixtureOfLinearRegressions

    loaded = sorted(name for name in NOT_FOR_A_FIT if name in sys.modules)
    rss_at_start = _memory_mb("VmRSS")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n_rows, 5))
    y = np.where(rng.random(n_rows) < 0.5, X @ np.ones(5), -(X @ np.ones(5)))
    MixtureOfLinearRegressions(n_components=2, random_state=0).fit(X, y)
    report.put(
        {
            "began": began,
            "loaded": loaded,
            "rss_at_start_mb": rss_at_start,
            "peak_mb": _memory_mb("VmHWM"),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=10, help="fit processes to start")
    parser.add_argument("--rows", type=int, default=2000, help="rows of each small fit")
    args = parser.parse_args()

    from service.jobs.supervisor import fit_process_context

    context = fit_process_context()
    report: Queue[dict[str, Any]] = context.Queue()
    warm_up = context.Process(target=_probe, args=(report, 10))
    warm_up.start()
    report.get()
    warm_up.join()

    start_ms, rss, peaks, loaded = [], [], [], set()
    for _ in range(args.starts):
        asked = time.perf_counter()
        process = context.Process(target=_probe, args=(report, args.rows))
        process.start()
        figures = report.get()
        process.join()
        start_ms.append((figures["began"] - asked) * 1000)
        rss.append(figures["rss_at_start_mb"])
        peaks.append(figures["peak_mb"])
        loaded.update(figures["loaded"])
    print(f"console script module: {CONSOLE_SCRIPT_MODULE}")
    print(f"fit processes started: {args.starts} (fits of {args.rows} rows x 5, k=2)")
    print(f"start (Process.start to target): median {statistics.median(start_ms):.1f} ms")
    print(f"resident memory at start: median {statistics.median(rss):.1f} MB")
    print(f"peak resident memory (VmHWM): median {statistics.median(peaks):.1f} MB")
    print(f"packages a fit does not need, loaded: {', '.join(sorted(loaded)) or 'none'}")
    with open("/proc/loadavg") as load:
        print(f"load average at the end: {load.read().split()[:3]}")


if __name__ == "__main__":
    main()
