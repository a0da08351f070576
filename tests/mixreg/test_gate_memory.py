"""The gate's Hessian is summed over blocks of rows: the same matrix, without ever holding the
(rows, k, q) products of every row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mixreg import _gate
from mixreg._gate import gate_hessian, log_gate

REPO = Path(__file__).resolve().parents[2]


def _dense_hessian(W: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Block (j, l) = (1/n) sum_i pi_ij (delta_jl - pi_il) w_i w_i^T, row by row."""
    pi = np.exp(log_gate(W, beta))
    free, p = beta.shape[0] - 1, W.shape[1]
    hessian = np.zeros((free * p, free * p))
    for i in range(W.shape[0]):
        outer = np.outer(W[i], W[i])
        for j in range(free):
            for m in range(free):
                c = pi[i, j + 1] * ((j == m) - pi[i, m + 1])
                hessian[j * p : (j + 1) * p, m * p : (m + 1) * p] += c * outer
    return hessian / W.shape[0]


@pytest.mark.parametrize("block_elements", [1, 7, 64, 1 << 20])
def test_the_blocked_hessian_is_the_hessian(monkeypatch, block_elements):
    monkeypatch.setattr(_gate, "_HESSIAN_BLOCK_ELEMENTS", block_elements)
    rng = np.random.default_rng(4)
    W = np.column_stack([rng.standard_normal((53, 3)), np.ones(53)])
    beta = rng.standard_normal((4, 4))
    beta[0] = 0.0
    np.testing.assert_allclose(gate_hessian(W, beta), _dense_hessian(W, beta), atol=1e-12)


PEAK_OF_A_GATE_HESSIAN = """
import resource
import numpy as np
from mixreg._gate import _hessian
rng = np.random.default_rng(0)
n, k, q = 300_000, 8, 30
W = np.column_stack([rng.standard_normal((n, q)), np.ones(n)])          # 74 MB
probabilities = rng.dirichlet(np.ones(k), size=n)[None]                 # 19 MB
weights = W * 1.0                                                       # 74 MB
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
_hessian(W, probabilities, weights)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024)
"""


def test_the_gate_hessian_of_many_rows_holds_no_rows_by_classes_by_columns():
    # All rows at once: (300,000 x 7 x 31) float64 products, 521 MB, twice with weights.
    result = subprocess.run(
        [sys.executable, "-c", PEAK_OF_A_GATE_HESSIAN],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    growth = int(result.stdout.strip())
    assert growth < 64 * 1024 * 1024, f"peak RSS grew by {growth / 2**20:.0f} MiB"
