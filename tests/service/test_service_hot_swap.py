"""Hot swaps: a prediction by ``name@alias`` never fails while the alias moves and its old
version is deleted (in this process, in another one, or by retention), and an alias move racing
the delete of its target version on PostgreSQL ends in a 409, never a 500."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from models_store import models as model_store
from models_store import registry
from models_store.common import utcnow
from models_store.session import session_scope
from service.config import Settings
from service.jobs.retention import apply_retention
from service.serving.prediction import ModelCache

# Long enough that only forgetting (or looking up again) can explain following a move.
REFRESH_S = 600.0


@pytest.fixture
def settings(migrated_database_url: str) -> Settings:
    """Without the embedded worker; aliases remembered for 10 minutes; the model cache checked
    against the database every 50 ms (as a process learns of deletes made elsewhere)."""
    return Settings(
        database_url=migrated_database_url,
        embedded_worker=False,
        alias_refresh_s=REFRESH_S,
        model_cache_check_interval_s=0.05,
    )


def fit_version(client: TestClient, run_queued_jobs, X, y, *, seed: int) -> str:
    """Fit (X, y) as the next version of ``reco``; return the model id."""
    response = client.post(
        "/fit",
        json={
            "data": {"X": X.tolist(), "y": y.tolist()},
            "k": 2,
            "algorithm": "am-classic",
            "seed": seed,
            "registered_model": "reco",
        },
    )
    assert response.status_code == 202, response.text
    assert run_queued_jobs() == ["succeeded"]
    return str(client.get(response.json()["url"]).json()["model_id"])


@pytest.fixture
def versions(client, data, run_queued_jobs) -> dict[int, str]:
    """Model ids of versions 1 and 2 of ``reco`` (the data, and the data shifted), with
    ``reco@production`` at version 1."""
    X, y = data
    ids = {
        1: fit_version(client, run_queued_jobs, X, y, seed=1),
        2: fit_version(client, run_queued_jobs, X, y + 10.0, seed=2),
    }
    move(client, 1)
    return ids


def move(client: TestClient, version: int) -> Any:
    response = client.put("/registered-models/reco/aliases/production", json={"version": version})
    assert response.status_code == 200, response.text
    return response


def predict(client: TestClient, reference: str, X) -> Any:
    return client.post("/predict", json={"model_id": reference, "X": X[:2].tolist()})


def answered_by(response: Any) -> tuple[int, int | None]:
    return response.status_code, response.json().get("version")


def test_the_process_that_moves_the_alias_and_deletes_the_old_version_follows_at_once(
    client, versions, data
):
    X, _ = data
    assert answered_by(predict(client, "reco@production", X)) == (200, 1)
    assert answered_by(predict(client, "reco/versions/1", X)) == (200, 1)
    move(client, 2)
    # Followed at once in this process, not after MIXREG_ALIAS_REFRESH_S.
    assert answered_by(predict(client, "reco@production", X)) == (200, 2)
    assert client.delete(f"/models/{versions[1]}").status_code == 204
    assert answered_by(predict(client, "reco@production", X)) == (200, 2)
    infer = client.post(
        "/v2/models/reco@production/infer",
        json={"inputs": [{"name": "X", "shape": [2, 2], "datatype": "FP64", "data": [0.0] * 4}]},
    )
    assert (infer.status_code, infer.json()["model_version"]) == (200, "2"), infer.text
    # A reference to the deleted version itself is really gone.
    gone = predict(client, "reco/versions/1", X)
    assert gone.status_code == 404
    assert "version 1" in gone.json()["detail"]


def test_a_removed_alias_is_forgotten_at_once(client, versions, data):
    X, _ = data
    assert answered_by(predict(client, "reco@production", X)) == (200, 1)
    assert client.delete("/registered-models/reco/aliases/production").status_code == 204
    gone = predict(client, "reco@production", X)
    assert gone.status_code == 404
    assert gone.json()["detail"] == "registered model reco has no alias 'production'"


def wait_until_evicted(client: TestClient, model_id: str) -> None:
    cache: ModelCache = client.app.state.model_cache  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while model_id in cache:
        assert time.monotonic() < deadline, "the cache check never evicted the deleted model"
        time.sleep(0.02)


def test_a_move_and_delete_made_by_another_process_do_not_fail_a_prediction(
    client, versions, data, app_sessionmaker
):
    X, _ = data
    assert answered_by(predict(client, "reco@production", X)) == (200, 1)
    # Another API process moves the alias and deletes the old version: this one still
    # remembers reco@production -> version 1 for REFRESH_S, and its cache check evicts the
    # deleted model's lines.
    with session_scope(app_sessionmaker) as session:
        assert registry.set_alias(
            session, name="reco", alias="production", version=2, changed_by=None
        )
    with session_scope(app_sessionmaker) as session:
        assert model_store.delete_model(session, model_id=versions[1])
    wait_until_evicted(client, versions[1])
    assert answered_by(predict(client, "reco@production", X)) == (200, 2)


def test_retention_deleting_the_old_version_right_after_a_move_fails_no_prediction(
    client, versions, data, app_sessionmaker, settings
):
    X, _ = data
    assert answered_by(predict(client, "reco@production", X)) == (200, 1)
    with session_scope(app_sessionmaker) as session:
        registry.set_alias(session, name="reco", alias="production", version=2, changed_by=None)
    expired = apply_retention(
        app_sessionmaker,
        settings.model_copy(update={"model_retention_days": 0.0}),
        now=utcnow(),
    )
    assert expired.expired_models == [versions[1]]
    wait_until_evicted(client, versions[1])
    assert answered_by(predict(client, "reco@production", X)) == (200, 2)


# --------------------------------------------------------------------------- PostgreSQL races


@contextmanager
def paused_after(engine: Engine, statement_start: str) -> Iterator[tuple[threading.Event, ...]]:
    """Pause the first statement of ``engine`` that starts with ``statement_start`` right after
    it ran (its transaction open, its locks held) until ``release`` is set; ``reached`` is set
    when it pauses."""
    reached, release = threading.Event(), threading.Event()
    armed = True

    def pause(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal armed
        if not armed or not statement.lstrip().upper().startswith(statement_start):
            return
        armed = False
        reached.set()
        release.wait(timeout=30)

    event.listen(engine, "after_cursor_execute", pause)
    try:
        yield reached, release
    finally:
        release.set()
        event.remove(engine, "after_cursor_execute", pause)


def wait_for_a_lock_wait(engine: Engine) -> None:
    """Wait until a session of this database waits for a row lock."""
    deadline = time.monotonic() + 10
    with engine.connect() as connection:
        while True:
            waiting = connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar()
            connection.rollback()
            if waiting:
                return
            assert time.monotonic() < deadline, "the second request never waited for a lock"
            time.sleep(0.02)


def in_thread(call) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(call()))
    thread.start()
    return thread, answers


def app_engine(app_sessionmaker: sessionmaker[Session]) -> Engine:
    engine = app_sessionmaker.kw["bind"]
    assert isinstance(engine, Engine)
    return engine


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_delete_racing_an_alias_move_onto_its_version_is_a_409(
    client, versions, app_sessionmaker
):
    engine = app_engine(app_sessionmaker)
    move(client, 2)
    # The move onto version 1 has written the alias and is about to commit when the delete of
    # version 1 starts.
    with paused_after(engine, "INSERT INTO MODEL_ALIAS_EVENTS") as (reached, release):
        mover, moved = in_thread(
            lambda: client.put("/registered-models/reco/aliases/production", json={"version": 1})
        )
        assert reached.wait(timeout=10)
        deleter, deleted = in_thread(lambda: client.delete(f"/models/{versions[1]}"))
        wait_for_a_lock_wait(engine)
        release.set()
        mover.join(timeout=30)
        deleter.join(timeout=30)
    assert moved[0].status_code == 200, moved[0].text
    assert deleted[0].status_code == 409, deleted[0].text
    assert "reco@production points at" in deleted[0].json()["detail"]
    assert client.get("/models/reco@production").json()["id"] == versions[1]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_an_alias_move_racing_the_delete_of_its_target_version_is_a_409(
    client, versions, app_sessionmaker
):
    engine = app_engine(app_sessionmaker)
    move(client, 2)
    # The delete of version 1 has run and is about to commit when the move onto it starts.
    with paused_after(engine, "DELETE FROM MODELS") as (reached, release):
        deleter, deleted = in_thread(lambda: client.delete(f"/models/{versions[1]}"))
        assert reached.wait(timeout=10)
        mover, moved = in_thread(
            lambda: client.put("/registered-models/reco/aliases/production", json={"version": 1})
        )
        wait_for_a_lock_wait(engine)
        release.set()
        deleter.join(timeout=30)
        mover.join(timeout=30)
    assert deleted[0].status_code == 204, deleted[0].text
    assert moved[0].status_code == 409, moved[0].text
    assert moved[0].json()["detail"] == (
        "version 1 of reco was deleted while reco@production was being moved onto it; "
        "the alias was not moved"
    )
    assert client.get("/models/reco@production").json()["id"] == versions[2]
    events = client.get("/registered-models/reco/alias-events").json()["items"]
    assert [(e["from_version"], e["to_version"]) for e in events] == [(1, 2), (None, 1)]
