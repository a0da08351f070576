"""``POST /fit`` naming dataset columns (weights, groups, a gate, a key column) reads no row of
the dataset: its request, which holds SQLite's write lock, checks the columns' names and types
from the dataset's record only. Values a fit cannot take fail the job, in the fit process, with
the message the 422 had."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

N_ROWS = 60


@pytest.fixture
def statements(client: TestClient) -> Iterator[list[str]]:
    """Every SQL statement the app runs from now on."""
    engine: Engine = client.app.state.session_factory.kw["bind"]  # type: ignore[attr-defined]
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


@pytest.fixture
def dataset_id(client: TestClient) -> str:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N_ROWS, 2))
    y = X @ [1.0, -1.0]
    gap = rng.standard_normal(N_ROWS).tolist()
    gap[17] = None
    columns = {
        "negative": [-1.0] + [1.0] * (N_ROWS - 1),
        "row": [f"r{i}" for i in range(N_ROWS)],
        "gap": gap,
        "score": [i / 2 for i in range(N_ROWS)],
        "account": [f"a{i % 3}" for i in range(N_ROWS)],
    }
    response = client.post("/datasets", json={"X": X.tolist(), "y": y.tolist(), "columns": columns})
    assert response.status_code == 201, response.text
    identifier: str = response.json()["id"]
    return identifier


CASES = {
    "weights": (
        {"weights": "negative"},
        "weights: column 'negative' is -1 in row 0; weights must be >= 0",
    ),
    "groups": ({"groups": "row"}, "groups: every row is its own group"),
    "gating": ({"gating": ["gap"]}, "gating[0] names 'gap' which has no number in row 17;"),
    "split_by numbers": (
        {"split_by": "score"},
        "split_by names 'score' whose numbers are not all integers (e.g. 0.5)",
    ),
    "split_by text": ({"split_by": "account"}, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fit_naming_columns_reads_no_row_and_bad_values_fail_the_job(
    client: TestClient, dataset_id: str, statements: list[str], run_queued_jobs, case: str
):
    extra, message = CASES[case]
    statements.clear()
    response = client.post("/fit", json={"dataset_id": dataset_id, "k": 2, **extra})
    assert response.status_code == 202, response.text
    read_rows = [statement for statement in statements if "dataset_chunks" in statement]
    assert read_rows == []
    assert statements, "the listener saw the request's statements"

    assert run_queued_jobs() == ["succeeded" if message is None else "failed"]
    job = client.get(response.json()["url"]).json()
    if message is not None:
        assert job["error"].startswith(message), job["error"]
        assert job["model_id"] is None


def test_a_column_the_dataset_does_not_keep_or_of_the_wrong_type_is_still_a_422(
    client: TestClient, dataset_id: str
):
    for extra, detail in [
        ({"weights": "row"}, "weights names 'row' which holds text; a number column is needed"),
        ({"gating": ["account"]}, "gating[0] names 'account' which holds text"),
        ({"split_by": "nope"}, "split_by names the column 'nope' which the dataset does not"),
        ({"groups": "nope"}, "groups names the column 'nope' which the dataset does not"),
    ]:
        response = client.post("/fit", json={"dataset_id": dataset_id, "k": 2, **extra})
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith(detail), response.json()["detail"]
