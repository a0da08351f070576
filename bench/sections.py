"""The sections of ``bench/RESULTS.md``, and the report and progress lines that fill them.

``python -m bench.algorithms`` writes the head of the file; every other benchmark owns one
section between the lines ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` and rewrites only
that, so the benchmarks can run (and be re-run) in any order.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy  # noqa: F401  (loaded, so that its BLAS is reported)
import threadpoolctl

_MARKED_SECTION = re.compile(r"<!-- ([a-z0-9_-]+):start -->.*?<!-- \1:end -->", re.DOTALL)


def markers(name: str) -> tuple[str, str]:
    """The lines that open and close the section ``name``."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def replace_section(document: str, name: str, text: str) -> str:
    """``document`` with the section ``name`` holding ``text``.

    Only the text between the section's markers is replaced; when the markers are missing
    (or out of order) the section is appended at the end.
    """
    start_marker, end_marker = markers(name)
    marked = f"{start_marker}\n{text.strip()}\n{end_marker}"
    start = document.find(start_marker)
    end = document.find(end_marker, start + len(start_marker)) if start >= 0 else -1
    if start >= 0 and end >= 0:
        return document[:start] + marked + document[end + len(end_marker) :]
    body = document.rstrip()
    return (body + "\n\n" if body else "") + marked + "\n"


def write_section(path: Path, name: str, text: str) -> None:
    """Replace (or append) the section ``name`` of the file ``path``, keeping everything else."""
    document = path.read_text() if path.exists() else ""
    path.write_text(replace_section(document, name, text))


def keep_sections(document: str, previous: str) -> str:
    """``document`` followed by every marked section of ``previous``, in their order."""
    sections = [match.group(0) for match in _MARKED_SECTION.finditer(previous)]
    if not sections:
        return document.rstrip() + "\n"
    return document.rstrip() + "\n\n" + "\n\n".join(sections) + "\n"


@dataclass
class Report:
    """Markdown of a run, built section by section and echoed to stdout, with its targets
    (name, goal, measured, met)."""

    lines: list[str] = field(default_factory=list)
    targets: list[tuple[str, str, str, bool]] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        for line in lines:
            print(line, flush=True)
        self.lines.extend(lines)

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self.add(
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows),
            "",
        )

    def target(self, name: str, goal: str, measured: str, met: bool) -> None:
        self.targets.append((name, goal, measured, met))

    def targets_table(
        self, targets: Sequence[tuple[str, str, str, bool]], *, first: str = "target"
    ) -> None:
        """A table of ``targets`` (another report's, or this one's): goal, measured, met."""
        self.table(
            [first, "goal", "measured", "met"],
            [
                [name, goal, measured, "yes" if met else "**no**"]
                for name, goal, measured, met in targets
            ],
        )


def log(message: str) -> None:
    """A progress line on standard error (standard output carries the report)."""
    print(f"# {message}", file=sys.stderr, flush=True)


def machine_lines(
    command: str, packages: Sequence[str] = ("numpy", "scikit-learn"), also: str | None = None
) -> list[str]:
    """The machine and the run, for the head of a section: CPU, cores, RAM, the versions of
    Python and ``packages`` (and ``also``, e.g. R's), BLAS, date, load average at the start
    and the command."""
    cpu = "unknown"
    with open("/proc/cpuinfo") as cpuinfo:
        cpu = next(
            (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
            cpu,
        )
    with open("/proc/meminfo") as meminfo:
        total_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal"))
    versions = [f"Python {platform.python_version()}"]
    for package in packages:
        try:
            versions.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            versions.append(f"{package} not installed")
    blas = [
        f"{info['internal_api']} {info.get('version')} ({info.get('threading_layer', '?')}, "
        f"{info['num_threads']} threads, {info.get('architecture', '?')}) "
        f"from {Path(info['filepath']).name}"
        for info in threadpoolctl.threadpool_info()
        if info["user_api"] == "blas"
    ]
    return [
        f"- CPU: {cpu}; {os.cpu_count()} logical cores "
        f"({len(os.sched_getaffinity(0))} usable by this process)",
        f"- RAM: {total_kib / 2**20:.1f} GiB",
        f"- {', '.join(versions)}" + (f"; {also}" if also else ""),
        f"- BLAS: {'; '.join(blas) or 'none reported by threadpoolctl'}",
        f"- Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; load average "
        f"(1, 5, 15 min) at the start: {load_average()}",
        f"- Command: `{command}`",
    ]


def load_average() -> str:
    """The load averages over 1, 5 and 15 minutes."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())
