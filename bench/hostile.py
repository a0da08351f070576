"""Hostile inputs: small requests that once cost gigabytes, a parser that stayed broken, and
alias hot swaps that answered 404, each re-run against a fresh server.

``python -m bench.hostile`` (``make bench-hostile``) runs the cases of
:mod:`bench.hostile_predict` (compressed ``.npz`` predict bodies, big JSON predict bodies),
:mod:`bench.hostile_ingest` (kept text columns, long keys) and :mod:`bench.hostile_parser` (the
JSON parser processes killed), then the hot-swap load of :mod:`bench.hostile_hotswap` on SQLite
and PostgreSQL, and writes the section "Hostile inputs" of ``bench/RESULTS.md``. Each case
gives the request's bytes, the answer, its time and the API process's peak RSS growth; the
target is an answer within 1 s with 413/422/503 and under 50 MB of growth, or a request served
within its setting.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import hostile_hotswap, hostile_ingest, hostile_parser, hostile_predict
from bench.load import DEFAULT_POSTGRES_URL, fresh_postgres_database
from bench.sections import Report, load_average, log, machine_lines, write_section

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = REPO_ROOT / "bench" / "RESULTS.md"
SECTION = "hostile-inputs"
REFUSALS = {413, 422, 503}
MAX_SECONDS, MAX_GROWTH_MB = 1.0, 50.0

CASES: dict[str, Callable[[], list[dict[str, object]]]] = {
    "predict bodies": hostile_predict.run,
    "uploads and keys": hostile_ingest.run,
    "parser processes": hostile_parser.run,
}


def verdict(row: dict[str, object]) -> str:
    """Whether a case met its target: refused quickly and cheaply, or served (any 2xx)."""
    status = int(str(row["status"]).split()[0])
    seconds = float(str(row["seconds"]))
    growth = float(str(row["api_peak_rss_growth_mb"]))
    if status in REFUSALS:
        met = seconds <= MAX_SECONDS and growth < MAX_GROWTH_MB
        return "yes" if met else "**no**"
    if 200 <= status < 300:
        return "served"
    return f"**{status}**"


def case_rows(rows: Sequence[dict[str, object]]) -> list[list[str]]:
    """The table rows of a group of cases."""
    return [
        [
            str(row["case"]),
            f"{int(str(row['request_bytes'])):,}",
            str(row["status"]),
            f"{float(str(row['seconds'])):.3f}",
            f"{float(str(row['api_peak_rss_growth_mb'])):.1f}",
            verdict(row),
            str(row.get("note", "")),
        ]
        for row in rows
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__)
    parser.add_argument("--moves", type=int, default=40, help="alias moves of the hot swap")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    report = Report()
    report.add(
        "## Hostile inputs",
        "",
        *machine_lines("python -m bench.hostile"),
        "",
        "Each case against a fresh server (SQLite, embedded worker, API keys on where the case "
        "needs one). Peak RSS growth is the API process's (VmHWM after the request less its "
        f"RSS before). Target: refused within {MAX_SECONDS:g} s with 413/422/503 and under "
        f"{MAX_GROWTH_MB:g} MB of growth, or served within its setting ('served').",
        "",
    )
    header = ["case", "request bytes", "answer", "seconds", "API peak growth (MB)", "met", "note"]
    for title, run in CASES.items():
        log(f"hostile: {title} (load {load_average()})")
        report.add(f"### {title.capitalize()}", "")
        report.table(header, case_rows(run()))
    report.add(
        "### Alias hot swaps",
        "",
        f"4 clients predict by `name@alias` on two API processes while the alias moves "
        f"{args.moves} times, the old version deleted right after each move.",
        "",
    )
    for backend in ("sqlite", "postgresql"):
        log(f"hostile: hot swaps on {backend} (load {load_average()})")
        with tempfile.TemporaryDirectory(prefix="mixreg-hotswap-") as tmp:
            folder = Path(tmp)
            settings = argparse.Namespace(
                moves=args.moves, interval=0.25, clients=4, alias_refresh="1.0"
            )
            if backend == "sqlite":
                outcome, _ = hostile_hotswap.run_backend(
                    f"sqlite:///{folder / 'mixreg.db'}", folder, settings
                )
            else:
                with fresh_postgres_database(DEFAULT_POSTGRES_URL, "mixreg_hotswap") as url:
                    outcome, _ = hostile_hotswap.run_backend(url, folder, settings)
        report.add(*hostile_hotswap.report_lines(backend, outcome), "")
    report.add(f"Load average at the end: {load_average()}.")
    write_section(args.output, SECTION, "\n".join(report.lines))


if __name__ == "__main__":
    main()
