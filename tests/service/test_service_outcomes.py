"""The prediction log and outcomes through the app: sampling settings, the logged rows, outcomes
joined to them, their metrics, bad input, retention in batches, the queue bound and scopes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select

from models_store import prediction_log
from models_store.session import session_scope
from models_store.tables import LoggedPrediction, PredictionOutcome
from service.auth.keys import environment_entry, new_key
from service.config import Settings
from service.jobs.retention import apply_retention
from service.main import create_app
from service.serving.prediction import StoredLines
from service.serving.prediction_log import PredictionLogger
from tests.service.conftest import LOCAL_URL


def flush(client: TestClient) -> None:
    """Write what the log holds now (its thread would within the flush interval)."""
    client.app.state.prediction_log.flush()  # type: ignore[attr-defined]


def counts(app_sessionmaker) -> tuple[int, int]:
    with session_scope(app_sessionmaker) as session:
        logged = session.scalar(select(func.count()).select_from(LoggedPrediction)) or 0
        outcomes = session.scalar(select(func.count()).select_from(PredictionOutcome)) or 0
    return logged, outcomes


def predict(client: TestClient, model: str, X, request_id: str | None = None):
    headers = {} if request_id is None else {"X-Request-ID": request_id}
    response = client.post("/predict", json={"model_id": model, "X": X}, headers=headers)
    assert response.status_code == 200, response.text
    return response


def test_off_by_default_and_every_answer_names_its_request(client, model_id, app_sessionmaker):
    response = predict(client, model_id, [[0.5, 1.0]])
    assert len(response.headers["X-Request-ID"]) == 32
    flush(client)
    assert counts(app_sessionmaker) == (0, 0)
    assert client.get("/prediction-log/settings").json() == {
        "default_sample_rate": 0.0,
        "targets": [],
    }


def test_logged_rows_hold_the_answer_and_outcomes_give_its_min_loss(
    client, model_id, app_sessionmaker
):
    put = client.put(f"/prediction-log/settings/{model_id}", json={"sample_rate": 1})
    assert put.status_code == 200, put.text
    assert put.json()["sample_rate"] == 1
    X = [[0.5, 1.0], [-1.0, 2.0], [3.0, 0.25]]
    answer = predict(client, model_id, X, request_id="batch-1")
    assert answer.headers["X-Request-ID"] == "batch-1"
    predictions = np.array(answer.json()["predictions"])
    flush(client)
    with session_scope(app_sessionmaker) as session:
        rows = prediction_log.logged_rows(session, request_ids=["batch-1"])
        assert sorted(rows) == [("batch-1", 0), ("batch-1", 1), ("batch-1", 2)]
        for (_, row), logged in rows.items():
            assert logged.model_id == model_id and logged.alias is None
            assert np.frombuffer(logged.features, "<f8").tolist() == X[row]
            # Bit for bit the answer.
            assert np.frombuffer(logged.predictions, "<f8").tolist() == predictions[row].tolist()

    y = [predictions[0, 0] + 0.5, predictions[1, 1] - 0.1, predictions[2, 0] + 3.0]
    posted = client.post(
        "/outcomes",
        json={"outcomes": [{"request_id": "batch-1", "row": i, "y": y[i]} for i in range(3)]},
    )
    assert posted.status_code == 201, posted.text
    assert posted.json() == {"stored": 3}

    errors = (np.array(y)[:, None] - predictions) ** 2
    metrics = client.get(
        "/outcomes/metrics", params={"model": model_id, "window": "hour", "tolerance": 1.0}
    )
    assert metrics.status_code == 200, metrics.text
    (window,) = metrics.json()["windows"]
    assert window["count"] == 3
    assert window["min_loss"] == pytest.approx(errors.min(axis=1).mean(), rel=1e-12)
    assert window["coverage"] == pytest.approx(2 / 3)
    best = np.bincount(errors.argmin(axis=1), minlength=2) / 3
    assert window["best_line_share"] == pytest.approx(best.tolist())
    assert window["most_likely_loss"] is None
    day = client.get("/outcomes/metrics", params={"model": model_id, "window": "day"}).json()
    assert day["windows"][0]["count"] == 3 and day["tolerance"] == 1.0

    # The /metrics export: the model's series over the last 24 hours.
    exported = client.get("/metrics").text
    assert f'mixreg_outcomes_24h{{alias="",model_id="{model_id}"' in exported
    assert 'mixreg_prediction_log_rows_total{state="written"} 3.0' in exported


def test_an_alias_has_its_own_rate_and_its_outcomes_are_told_apart(
    client, data, run_queued_jobs, app_sessionmaker
):
    X, y = data
    fitted = client.post(
        "/fit",
        json={
            "data": {"X": X.tolist(), "y": y.tolist()},
            "k": 2,
            "algorithm": "am-classic",
            "registered_model": "recommender",
        },
    )
    assert fitted.status_code == 202, fitted.text
    assert run_queued_jobs() == ["succeeded"]
    model_id = client.get(fitted.json()["url"]).json()["model_id"]
    moved = client.put("/registered-models/recommender/aliases/production", json={"version": 1})
    assert moved.status_code == 200, moved.text
    assert (
        client.put(
            "/prediction-log/settings/recommender@production", json={"sample_rate": 1}
        ).status_code
        == 200
    )
    predict(client, "recommender@production", [[1.0, 1.0]], request_id="by-alias")
    predict(client, model_id, [[1.0, 1.0]], request_id="by-id")  # the default: not logged
    flush(client)
    with session_scope(app_sessionmaker) as session:
        rows = prediction_log.logged_rows(session, request_ids=["by-alias", "by-id"])
    assert list(rows) == [("by-alias", 0)]
    assert rows["by-alias", 0].alias == "production"
    assert rows["by-alias", 0].registered_model == "recommender"


def test_a_rate_needs_an_existing_model_or_alias(client, model_id):
    missing = client.put("/prediction-log/settings/" + "0" * 32, json={"sample_rate": 1})
    assert missing.status_code == 404
    assert "does not exist" in missing.json()["detail"]
    assert (
        client.put("/prediction-log/settings/nobody@prod", json={"sample_rate": 1}).status_code
        == 404
    )
    plain = client.put("/prediction-log/settings/recommender", json={"sample_rate": 1})
    assert plain.status_code == 422 and "name@alias" in plain.json()["detail"]
    above = client.put(f"/prediction-log/settings/{model_id}", json={"sample_rate": 1.5})
    assert above.status_code == 422
    assert client.delete(f"/prediction-log/settings/{model_id}").status_code == 404
    assert (
        client.put(f"/prediction-log/settings/{model_id}", json={"sample_rate": 0.5}).status_code
        == 200
    )
    assert client.delete(f"/prediction-log/settings/{model_id}").status_code == 204
    assert client.get("/prediction-log/settings").json()["targets"] == []


def test_bad_outcomes_are_refused_by_name_and_nothing_is_stored(client, model_id, app_sessionmaker):
    client.put(f"/prediction-log/settings/{model_id}", json={"sample_rate": 1})
    predict(client, model_id, [[0.5, 1.0], [1.0, 0.0]], request_id="two-rows")
    flush(client)
    good = {"request_id": "two-rows", "row": 0, "y": 1.0}

    def refused(items, *, raw: str | None = None) -> str:
        if raw is None:
            response = client.post("/outcomes", json={"outcomes": items})
        else:
            response = client.post(
                "/outcomes", content=raw, headers={"Content-Type": "application/json"}
            )
        assert response.status_code == 422, response.text
        assert counts(app_sessionmaker) == (2, 0)
        return str(response.json())

    assert "'nobody' has no logged prediction" in refused(
        [good, {"request_id": "nobody", "y": 1.0}]
    )
    assert "predicted rows 0 to 1; row 5 was never predicted" in refused(
        [good, {"request_id": "two-rows", "row": 5, "y": 1.0}]
    )
    nan = refused(None, raw='{"outcomes": [{"request_id": "two-rows", "y": NaN}]}')
    assert "outcomes" in nan and "y" in nan
    assert "given twice in this body" in refused([good, good])
    assert client.post("/outcomes", json={"outcomes": [good]}).status_code == 201
    again = client.post("/outcomes", json={"outcomes": [good]})
    assert again.status_code == 422
    assert "already posted" in again.json()["detail"]
    assert counts(app_sessionmaker) == (2, 1)


def test_retention_deletes_old_rows_in_bounded_transactions(
    client, model_id, app_sessionmaker, settings
):
    now = datetime.now(UTC)
    old, new = now - timedelta(days=40), now - timedelta(days=1)

    def row(request_id: str, at: datetime) -> tuple[object, ...]:
        values = {
            "request_id": request_id,
            "row_index": 0,
            "logged_at": at,
            "model_id": model_id,
            "features": np.array([1.0, 2.0]).tobytes(),
            "predictions": np.array([0.0, 1.0]).tobytes(),
        }
        return tuple(values.get(column) for column in prediction_log.LOGGED_COLUMNS)

    with session_scope(app_sessionmaker) as session:
        prediction_log.insert_logged_rows(
            session, [row(f"old-{i}", old) for i in range(10)] + [row("new", new)]
        )
    deletes: list[str] = []
    commits: list[int] = []
    engine = app_sessionmaker.kw["bind"]

    def seen(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("DELETE FROM PREDICTION_LOG"):
            deletes.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    event.listen(engine, "commit", lambda conn: commits.append(len(deletes)))
    try:
        report = apply_retention(
            app_sessionmaker,
            settings.model_copy(update={"log_delete_batch_rows": 3}),
            now=now,
        )
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert report.expired_logged_rows == 10
    # 3 + 3 + 3 + 1 rows: four deletes, each committed on its own before the next.
    assert len(deletes) == 4
    assert sorted({n for n in commits if n}) == [1, 2, 3, 4]
    with session_scope(app_sessionmaker) as session:
        left = list(session.scalars(select(LoggedPrediction.request_id)))
    assert left == ["new"]


def test_sampling_follows_its_rate():
    log = PredictionLogger(
        session_factory=None,  # type: ignore[arg-type]  (nothing is written here)
        default_rate=0.01,
        queue_rows=10**7,
        flush_interval_s=1,
        refresh_s=1,
    )
    lines = StoredLines(model_id="m" * 32, coef=np.zeros((2, 1)), intercept=np.zeros(2))
    X = np.zeros((1, 1))
    for _ in range(100_000):
        log.offer(
            request_id="r",
            reference="m" * 32,
            lines=lines,
            X=X,
            keys=None,
            unknown_keys="global",
            concomitant=None,
        )
    taken = log.counts.sampled_rows
    # Binomial(100000, 0.01): mean 1000, standard deviation 31.5; five of them either side.
    assert abs(taken - 1000) < 160
    log.set_rate("m" * 32, 0.0)
    before = log.counts.sampled_rows
    for _ in range(1000):
        log.offer(
            request_id="r",
            reference="m" * 32,
            lines=lines,
            X=X,
            keys=None,
            unknown_keys="global",
            concomitant=None,
        )
    assert log.counts.sampled_rows == before


def test_a_full_queue_drops_and_counts_instead_of_waiting(client, model_id):
    # A log of room for 4 rows that is never written on its own (as under a database that
    # cannot keep up).
    small = PredictionLogger(
        session_factory=client.app.state.session_factory,  # type: ignore[attr-defined]
        default_rate=1.0,
        queue_rows=4,
        flush_interval_s=60,
        refresh_s=60,
    )
    client.app.state.prediction_log = small  # type: ignore[attr-defined]
    predict(client, model_id, [[1.0, 2.0]] * 3)  # 3 rows queued
    predict(client, model_id, [[1.0, 2.0]] * 3)  # 6 > 4: dropped, answered all the same
    exported = client.get("/metrics").text
    assert 'mixreg_prediction_log_rows_total{state="dropped"} 3.0' in exported
    assert "mixreg_prediction_log_queued_rows 3.0" in exported
    assert small.flush() == 3
    assert 'mixreg_prediction_log_rows_total{state="written"} 3.0' in client.get("/metrics").text


def test_setting_rates_and_posting_outcomes_need_write_and_metrics_read(sqlite_url):
    reader, writer = new_key(scope="read"), new_key(scope="write")
    settings = Settings(
        database_url=sqlite_url,
        embedded_worker=False,
        api_keys=",".join(environment_entry(made.record) for made in (reader, writer)),
    )
    with TestClient(create_app(settings), base_url=LOCAL_URL) as client:
        read = {"Authorization": f"Bearer {reader.key}"}
        write = {"Authorization": f"Bearer {writer.key}"}
        target = "/prediction-log/settings/" + "0" * 32
        outcome = {"outcomes": [{"request_id": "r", "y": 1.0}]}
        assert client.put(target, json={"sample_rate": 1}, headers=read).status_code == 403
        assert client.delete(target, headers=read).status_code == 403
        assert client.post("/outcomes", json=outcome, headers=read).status_code == 403
        assert client.get("/prediction-log/settings", headers=read).status_code == 200
        metrics = client.get("/outcomes/metrics", params={"model": "0" * 32}, headers=read)
        assert metrics.status_code == 200 and metrics.json()["windows"] == []
        # A write key gets through to the checks: no such model, no such request.
        assert client.put(target, json={"sample_rate": 1}, headers=write).status_code == 404
        assert client.post("/outcomes", json=outcome, headers=write).status_code == 422
        assert client.get("/prediction-log/settings").status_code == 401


def test_a_gated_rows_most_likely_line_and_a_keyed_rows_key_are_logged_and_scored(
    db_sessionmaker,
):
    from mixreg import KeyedMixture
    from mixreg.service_support import STATUSES
    from service.serving.outcomes import RealisedValue, filter_of, outcome_metrics, record_outcomes
    from service.serving.prediction import StoredGate, positions_of

    log = PredictionLogger(
        session_factory=db_sessionmaker,
        default_rate=1.0,
        queue_rows=100,
        flush_interval_s=60,
        refresh_s=60,
    )
    # Lines y = x1 and y = x2; the gate prefers line 0 where x1 > 0.
    gated = StoredLines(
        model_id="a" * 32,
        coef=np.eye(2),
        intercept=np.zeros(2),
        gate=StoredGate(
            coef=np.array([[5.0, 0.0], [-5.0, 0.0]]), intercept=np.zeros(2), concomitant=None
        ),
    )
    keyed_lines = KeyedMixture(
        keys=np.array(["alice", "bob"], dtype=object),
        coef=np.array([np.eye(2), 2 * np.eye(2)]),
        intercept=np.zeros((2, 2)),
        shares=np.full((2, 2), 0.5),
        min_loss=np.zeros(2),
        n_rows=np.array([10, 10]),
        status=np.array([STATUSES.index("fitted")] * 2),
    )
    keyed = StoredLines(
        model_id="b" * 32,
        coef=np.eye(2),
        intercept=np.zeros(2),
        split_by="user",
        keyed=keyed_lines,
        key_positions=positions_of(keyed_lines),
    )
    common = {"unknown_keys": "global", "concomitant": None}
    log.offer(
        request_id="g",
        reference="a" * 32,
        lines=gated,
        X=np.array([[1.0, 3.0]]),
        keys=None,
        **common,
    )
    log.offer(
        request_id="k",
        reference="b" * 32,
        lines=keyed,
        X=np.array([[1.0, 3.0]] * 2),
        keys=["alice", "bob"],
        **common,
    )
    assert log.flush() == 3
    now = datetime.now(UTC)
    with session_scope(db_sessionmaker) as session:
        stored = record_outcomes(
            session,
            [
                RealisedValue("g", 0, 3.1),  # best: line 1 (0.01); most likely: line 0 (4.41)
                RealisedValue("k", 0, 1.0),  # alice: [1, 3], line 0 exact
                RealisedValue("k", 1, 5.0),  # bob: [2, 6], line 1 off by 1
            ],
            now=now,
        )
    assert stored == 3
    with session_scope(db_sessionmaker) as session:
        (gate_window,) = outcome_metrics(
            session,
            where=filter_of("a" * 32, None),
            window="hour",
            since=now - timedelta(hours=1),
            until=now,
            tolerance=0.5,
        )
        (bob,) = outcome_metrics(
            session,
            where=filter_of("b" * 32, "bob"),
            window="day",
            since=now - timedelta(hours=1),
            until=now,
            tolerance=0.5,
        )
    assert gate_window["min_loss"] == pytest.approx(0.01)
    assert gate_window["most_likely_loss"] == pytest.approx(4.41)
    assert gate_window["best_line_share"] == [0.0, 1.0]
    assert bob["count"] == 1 and bob["min_loss"] == pytest.approx(1.0) and bob["coverage"] == 0.0


def test_requests_through_the_app_are_sampled_at_their_rate(client, model_id, app_sessionmaker):
    assert (
        client.put(f"/prediction-log/settings/{model_id}", json={"sample_rate": 0.2}).status_code
        == 200
    )
    for _ in range(500):
        predict(client, model_id, [[0.5, 1.0]])
    flush(client)
    logged, _ = counts(app_sessionmaker)
    # Binomial(500, 0.2): mean 100, standard deviation 8.9; five of them either side.
    assert abs(logged - 100) < 45
