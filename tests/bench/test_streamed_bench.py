"""The streamed-fit benchmark at a tiny size: its chunks, its fits and its table."""

from __future__ import annotations

import numpy as np

from bench.streamed import lines_difference, report_lines, run_one, write_mixture
from mixreg import NpyChunks


def test_tiny_streamed_bench_fits_as_in_memory_and_reaches_the_oracle(tmp_path) -> None:
    write_mixture(tmp_path, 1_500, 400, n_components=2, n_features=3)
    source = NpyChunks(tmp_path)
    assert source.chunk_rows == [400, 400, 400, 300]
    results = {mode: run_one(mode, tmp_path) for mode in ("oracle", "streamed", "in-memory")}
    assert lines_difference(results["in-memory"], results["streamed"]) < 1e-8
    assert results["streamed"]["passes"] > 5
    assert results["in-memory"]["passes"] is None
    oracle = results["oracle"]["train_loss"]
    assert results["streamed"]["train_loss"] <= oracle * 1.001
    # The oracle's lines are the true ones, polished: near the noise's variance (0.1^2).
    assert 0.005 < oracle < 0.02
    report = report_lines({1_500: results}, 400)
    table = [line for line in report.lines if line.startswith("| 1,500")]
    assert [row.split(" | ")[1] for row in table] == ["streamed", "in-memory"]
    assert np.isfinite(float(table[0].split(" | ")[5]))
