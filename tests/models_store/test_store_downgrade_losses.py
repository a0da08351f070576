"""``mixreg db downgrade`` (the console script, on a real SQLite file) refuses, without
``--yes``, a downgrade that deletes rows or turns models into something else, and says what
goes: how many of what."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import sessionmaker

from models_store import datasets as dataset_store
from models_store import migrate, registry
from models_store import models as model_store
from models_store.session import make_engine, session_scope
from models_store.tables import Model

REPO = Path(__file__).resolve().parents[2]
MIXREG = REPO / ".venv" / "bin" / "mixreg"


def _model(session, *, dataset_id: str) -> str:
    return model_store.create_model(
        session,
        model_store.ModelRecord(
            job_id=None,
            dataset_id=dataset_id,
            name=None,
            algorithm="am",
            n_components=1,
            n_features=1,
            feature_names=["x0"],
            fit_intercept=True,
            params={},
            seed=0,
            coef=[[1.0]],
            intercept=[0.5],
            shares=[1.0],
            train_min_loss=0.1,
            holdout_min_loss=None,
            baseline={"train_min_loss": 0.2, "holdout_min_loss": None},
            n_train=2,
            n_holdout=0,
            loss_history=[0.1],
            n_iter=1,
            fit_seconds=0.0,
        ),
    ).id


@pytest.fixture
def database(migrated_sqlite_url: str) -> str:
    """A SQLite file at head holding a model of a stored dataset, an imported model (no
    dataset), a keyed model of 3 keys whose dataset was deleted, and a registered name."""
    url = migrated_sqlite_url
    engine = make_engine(url)
    try:
        with session_scope(sessionmaker(engine)) as session:
            dataset = dataset_store.create_dataset(
                session,
                X=[[1.0], [2.0]],
                y=[1.0, 2.0],
                feature_names=None,
                target_name=None,
                name=None,
            )
            kept = _model(session, dataset_id=dataset.id)
            _model(session, dataset_id="imported000000000000000000000000")
            keyed = _model(session, dataset_id="deleted0000000000000000000000000")
            registry.create_version(session, name="reco", model_id=kept)
        with engine.begin() as connection:
            connection.execute(
                text("UPDATE models SET split_by = 'acct' WHERE id = :id"), {"id": keyed}
            )
            connection.execute(
                text(
                    "INSERT INTO keyed_model_chunks (model_id, position, n_keys, data) "
                    "VALUES (:id, 0, 3, :data)"
                ),
                {"id": keyed, "data": b"npz"},
            )
    finally:
        engine.dispose()
    return url


def _db(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "MIXREG_DATABASE_URL": url}
    return subprocess.run(
        [str(MIXREG), "db", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )


def _models(url: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.scalar(select(func.count()).select_from(Model)) or 0)
    finally:
        engine.dispose()


def test_a_downgrade_that_deletes_models_says_what_and_waits_for_yes(database):
    head = migrate.current_revision(database)
    refused = _db(database, "downgrade", "0006")
    assert refused.returncode == 2, refused.stderr
    for line in (
        "downgrading to 0006 loses data",
        "2 model(s) whose dataset is gone",
        "1 keyed model(s) become plain models",
        "the lines of 3 key(s) of keyed models are deleted",
        "1 registered model name(s) are deleted",
        "1 model version(s) are deleted",
        "--yes",
    ):
        assert line in refused.stderr
    assert migrate.current_revision(database) == head and _models(database) == 3

    confirmed = _db(database, "downgrade", "0006", "--yes")
    assert confirmed.returncode == 0, confirmed.stderr
    assert migrate.current_revision(database) == "0006" and _models(database) == 1


def test_undoing_keyed_models_names_only_that_loss(database):
    refused = _db(database, "downgrade", "0011")
    assert refused.returncode == 2
    assert "1 keyed model(s) become plain models" in refused.stderr
    assert "dataset is gone" not in refused.stderr  # revision 0007 is not undone
    assert migrate.current_revision(database) == migrate.head_revision()

    one_step = _db(database, "downgrade", "-1")  # 0032 loses no rows here: no question asked
    assert one_step.returncode == 0, one_step.stderr
    assert _db(database, "downgrade", "0011", "--yes").returncode == 0
    assert migrate.current_revision(database) == "0011" and _models(database) == 3


def test_a_downgrade_of_an_empty_database_asks_nothing(migrated_sqlite_url):
    url = migrated_sqlite_url
    done = _db(url, "downgrade", "0006")
    assert done.returncode == 0, done.stderr
    assert migrate.current_revision(url) == "0006"


def test_every_loss_is_counted_on_both_backends(migrated_database_url):
    # An empty database at head: every count query of every revision runs, and finds nothing.
    assert migrate.downgrade_losses(migrated_database_url, "base") == []
    assert migrate.downgrade_losses(migrated_database_url, "-3") == []
    assert migrate.downgrade_losses(migrated_database_url, "no-such-revision") == []
