"""The README's Python example runs as written and does what its comments say."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[2] / "README.md"


def python_example() -> str:
    section = README.read_text().split("## The estimator from Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert match is not None, "the README has no Python example under its heading"
    return match.group(1)


def test_the_readme_python_example_runs(capsys):
    namespace: dict[str, object] = {}
    exec(compile(python_example(), str(README), "exec"), namespace)
    model = namespace["model"]
    predictions = namespace["predictions"]
    X_test = namespace["X_test"]
    assert predictions.shape == (len(X_test), 2)
    assert np.all(np.diff(model.shares_) <= 0)
    printed = [float(value) for value in capsys.readouterr().out.split()]
    assert len(printed) == 3 and printed[0] == printed[1]
    assert printed[2] == 2 == namespace["selection"].best_n_components
    assert {candidate["source"] for candidate in model.candidates_} >= {"em", "subsample+am"}


def test_the_readme_gated_example_runs(capsys):
    section = README.read_text().split("## The estimator from Python", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) >= 2, "the README has no gated example under its heading"
    namespace: dict[str, object] = {}
    exec(compile(blocks[1], str(README), "exec"), namespace)
    data, gated = namespace["data"], namespace["gated"]
    np.testing.assert_allclose(namespace["probabilities"].sum(axis=1), 1.0)
    values = gated.predict(data.X)
    chosen = namespace["probabilities"].argmax(axis=1)
    np.testing.assert_array_equal(namespace["likely"], values[np.arange(len(chosen)), chosen])
    log_likelihood, bic = (float(value) for value in capsys.readouterr().out.split())
    assert log_likelihood == gated.log_likelihood_ and bic > -2 * log_likelihood
