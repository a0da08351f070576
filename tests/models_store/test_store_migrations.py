"""Alembic owns the schema: up, down and up again, and the models agree with the migrations."""

from __future__ import annotations

import json
from datetime import timedelta
from importlib import resources
from typing import Any

import numpy as np
import procrastinate
import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, make_url, text
from sqlalchemy.orm import Session

from models_store import Base, migrate
from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store import models as model_store
from models_store import shards as shard_store
from models_store.common import utcnow
from models_store.session import make_engine, make_sessionmaker, session_scope

APP_TABLES = {
    "datasets",
    "dataset_chunks",
    "jobs",
    "models",
    "registered_models",
    "model_versions",
    "model_aliases",
    "model_alias_events",
    "keyed_model_chunks",
    "keyed_job_shards",
    "keyed_job_shard_claims",
    "prediction_log_settings",
    "prediction_log",
    "prediction_outcomes",
}
TABLES_OF_0002 = {"datasets", "jobs", "models"}
# Procrastinate's queue (revision 0003), on PostgreSQL only.
QUEUE_TABLES = {
    "procrastinate_jobs",
    "procrastinate_events",
    "procrastinate_periodic_defers",
    "procrastinate_workers",
}


def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def tables_at_head(url: str) -> set[str]:
    return APP_TABLES | (QUEUE_TABLES if url.startswith("postgresql") else set())


def queue_routines_and_types(url: str) -> set[str]:
    """Names of Procrastinate's functions and types left in the database (PostgreSQL)."""
    if not url.startswith("postgresql"):
        return set()
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return set(
                connection.scalars(
                    text(
                        "SELECT proname FROM pg_proc WHERE proname LIKE 'procrastinate%' "
                        "UNION SELECT typname FROM pg_type WHERE typname LIKE 'procrastinate%'"
                    )
                )
            )
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(database_url):
    assert migrate.current_revision(database_url) is None
    assert table_names(database_url) == set()

    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()
    assert table_names(database_url) == tables_at_head(database_url)

    migrate.downgrade(database_url)
    assert migrate.current_revision(database_url) is None
    assert table_names(database_url) == set()
    assert queue_routines_and_types(database_url) == set()

    migrate.upgrade(database_url)
    migrate.upgrade(database_url)  # already at head: nothing to do
    assert migrate.current_revision(database_url) == migrate.head_revision()
    assert table_names(database_url) == tables_at_head(database_url)


def test_revision_0003_installs_a_working_procrastinate_queue_on_postgresql(postgres_url):
    migrate.upgrade(postgres_url, "0002")
    assert queue_routines_and_types(postgres_url) == set()
    migrate.upgrade(postgres_url, "0003")
    assert "procrastinate_defer_jobs_v1" in queue_routines_and_types(postgres_url)

    app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector())

    @app.task(name="probe")
    def probe(value: int) -> None:  # pragma: no cover - never run, only deferred
        del value

    conninfo = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(conninfo) as connection:
        task_id = probe.configure(connection=connection).defer(value=7)
        row = connection.execute(
            "SELECT task_name, status, args FROM procrastinate_jobs WHERE id = %s", (task_id,)
        ).fetchone()
    assert row == ("probe", "todo", {"value": 7})

    migrate.downgrade(postgres_url, "0002")
    assert table_names(postgres_url) == TABLES_OF_0002
    assert queue_routines_and_types(postgres_url) == set()


def test_revision_0003_leaves_sqlite_without_a_queue(sqlite_url):
    migrate.upgrade(sqlite_url, "0003")
    assert table_names(sqlite_url) == TABLES_OF_0002
    engine = make_engine(sqlite_url)
    try:
        columns = {column["name"] for column in inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()
    assert "task_id" in columns


def test_models_match_the_migrations(migrated_database_url):
    engine = make_engine(migrated_database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={
                    "compare_type": True,
                    "compare_server_default": True,
                    "include_name": migrate.include_name,
                },
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_constraint_names_follow_the_naming_convention(migrated_database_url):
    engine = make_engine(migrated_database_url)
    try:
        inspector = inspect(engine)
        # PostgreSQL also lists the index behind the unique constraint.
        assert "ix_jobs_status" in {ix["name"] for ix in inspector.get_indexes("jobs")}
        assert [uq["name"] for uq in inspector.get_unique_constraints("jobs")] == [
            "uq_jobs_idempotency_scope_key"
        ]
        assert [uq["name"] for uq in inspector.get_unique_constraints("datasets")] == [
            "uq_datasets_idempotency_scope_key"
        ]
        # Revision 0007 dropped the dataset's foreign key: a dataset may be deleted.
        assert {fk["name"] for fk in inspector.get_foreign_keys("models")} == {
            "fk_models_job_id_jobs",
        }
        assert {fk["name"] for fk in inspector.get_foreign_keys("model_aliases")} == {
            "fk_model_aliases_registered_model_registered_models",
            "fk_model_aliases_version_model_versions",
        }
        assert {fk["name"] for fk in inspector.get_foreign_keys("model_versions")} == {
            "fk_model_versions_model_id_models",
            "fk_model_versions_registered_model_registered_models",
        }
    finally:
        engine.dispose()


def test_migrations_run_from_any_working_directory(sqlite_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    migrate.upgrade(sqlite_url)
    assert migrate.current_revision(sqlite_url) == migrate.head_revision()


def test_env_falls_back_to_the_mixreg_database_url_variable(sqlite_url, monkeypatch):
    monkeypatch.setenv("MIXREG_DATABASE_URL", sqlite_url)
    config = Config()  # no sqlalchemy.url: env.py must find the database by itself
    config.set_main_option("script_location", str(resources.files("migrations")))
    command.upgrade(config, "head")
    assert migrate.current_revision(sqlite_url) == migrate.head_revision()


def _json(value: Any) -> Any:
    # SQLite hands JSON back as text through a plain SELECT; psycopg parses it.
    return json.loads(value) if isinstance(value, str) else value


def test_rows_stored_before_revision_0002_survive_its_upgrade_and_downgrade(database_url):
    migrate.upgrade(database_url, "0001")
    engine = make_engine(database_url)
    at = "2030-01-01T12:00:00+00:00"
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO datasets (id, n_rows, n_features, feature_names, x_data, "
                    "y_data, created_at) VALUES ('d1', 1, 1, '[\"x0\"]', :x, :y, :at)"
                ),
                {"x": b"\0" * 8, "y": b"\0" * 8, "at": at},
            )
            connection.execute(
                text(
                    "INSERT INTO jobs (id, status, dataset_id, algorithm, n_components, params, "
                    "fit_intercept, holdout_fraction, attempts, max_attempts, cancel_requested, "
                    "progress_fraction, created_at, model_id) VALUES ('j1', 'succeeded', 'd1', "
                    "'am', 2, '{\"step_size\": 0.1}', :true, 0.2, 1, 3, :false, 1.0, :at, 'm1')"
                ),
                {"true": True, "false": False, "at": at},
            )
            connection.execute(
                text(
                    "INSERT INTO models (id, job_id, dataset_id, algorithm, n_components, "
                    "n_features, feature_names, fit_intercept, params, coef, intercept, shares, "
                    "train_min_loss, baseline, n_train, n_holdout, loss_history, n_iter, "
                    "fit_seconds, created_at) VALUES ('m1', 'j1', 'd1', 'am', 1, 1, '[\"x0\"]', "
                    ":true, '{}', '[[2.5]]', '[0.5]', '[1.0]', 0.25, '{}', 1, 0, '[0.25]', 1, "
                    "0.01, :at)"
                ),
                {"true": True, "at": at},
            )

        migrate.upgrade(database_url)
        with engine.connect() as connection:
            job = connection.execute(
                text(
                    "SELECT params, model_id, k_values, sweep, warnings, progress_n_components "
                    "FROM jobs"
                )
            ).one()
            model = connection.execute(
                text(
                    "SELECT coef, train_min_loss, converged, log_likelihood, bic, n_parameters, "
                    "candidates, warnings FROM models"
                )
            ).one()
        assert (_json(job.params), job.model_id) == ({"step_size": 0.1}, "m1")
        assert (job.k_values, job.sweep, _json(job.warnings), job.progress_n_components) == (
            None,
            None,
            [],
            None,
        )
        assert (_json(model.coef), model.train_min_loss) == ([[2.5]], 0.25)
        assert (model.converged, model.log_likelihood, model.bic, model.n_parameters) == (
            None,
            None,
            None,
            None,
        )
        assert (model.candidates, _json(model.warnings)) == (None, [])

        migrate.downgrade(database_url, "0001")
        with engine.connect() as connection:
            assert connection.execute(text("SELECT id, model_id FROM jobs")).one() == ("j1", "m1")
            assert connection.execute(text("SELECT id, job_id FROM models")).one() == ("m1", "j1")
    finally:
        engine.dispose()


def test_revision_0007_keeps_rows_and_its_downgrade_drops_the_registry(database_url):
    migrate.upgrade(database_url, "0005")
    engine = make_engine(database_url)
    at = "2030-01-01T12:00:00+00:00"
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO datasets (id, n_rows, n_features, feature_names, created_at) "
                    "VALUES ('d1', 1, 1, '[\"x0\"]', :at)"
                ),
                {"at": at},
            )
            connection.execute(
                text(
                    "INSERT INTO jobs (id, status, dataset_id, algorithm, n_components, params, "
                    "fit_intercept, holdout_fraction, attempts, max_attempts, cancel_requested, "
                    "progress_fraction, created_at, model_id, warnings) VALUES ('j1', "
                    "'succeeded', 'd1', 'am', 1, '{}', :true, 0.2, 1, 3, :false, 1.0, :at, "
                    "'m1', '[]')"
                ),
                {"true": True, "false": False, "at": at},
            )
            connection.execute(
                text(
                    "INSERT INTO models (id, job_id, dataset_id, algorithm, n_components, "
                    "n_features, feature_names, fit_intercept, params, coef, intercept, shares, "
                    "train_min_loss, baseline, n_train, n_holdout, loss_history, n_iter, "
                    "fit_seconds, created_at, warnings) VALUES ('m1', 'j1', 'd1', 'am', 1, 1, "
                    "'[\"x0\"]', :true, '{}', '[[2.5]]', '[0.5]', '[1.0]', 0.25, '{}', 1, 0, "
                    "'[0.25]', 1, 0.01, :at, '[]')"
                ),
                {"true": True, "at": at},
            )

        migrate.upgrade(database_url)
        with engine.begin() as connection:
            assert connection.execute(text("SELECT registered_model FROM jobs")).one() == (None,)
            connection.execute(
                text(
                    "INSERT INTO registered_models (name, latest_version, created_at) "
                    "VALUES ('reco', 1, :at)"
                ),
                {"at": at},
            )
            connection.execute(
                text(
                    "INSERT INTO model_versions (registered_model, version, model_id, created_at) "
                    "VALUES ('reco', 1, 'm1', :at)"
                ),
                {"at": at},
            )
            connection.execute(
                text(
                    "INSERT INTO model_aliases (registered_model, alias, version, updated_at) "
                    "VALUES ('reco', 'production', 1, :at)"
                ),
                {"at": at},
            )

        migrate.downgrade(database_url, "0005")
        assert not {"registered_models", "model_versions", "model_aliases"} & table_names(
            database_url
        )
        with engine.connect() as connection:
            assert connection.execute(text("SELECT id, dataset_id FROM jobs")).one() == (
                "j1",
                "d1",
            )
            assert connection.execute(text("SELECT id FROM models")).one() == ("m1",)
    finally:
        engine.dispose()


def test_idempotency_keys_stored_before_revision_0006_keep_their_caller(database_url):
    migrate.upgrade(database_url, "0005")
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO datasets (id, n_rows, n_features, feature_names, created_at, "
                    "idempotency_key, request_hash) VALUES ('d1', 1, 1, '[\"x0\"]', "
                    "'2030-01-01T12:00:00+00:00', 'upload-1', 'h')"
                )
            )
            for job_id, key, owner, minute in (
                ("j1", "fit-1", "keyA", 1),
                ("j2", "fit-2", None, 2),
                ("j3", None, "keyA", 3),
            ):
                connection.execute(
                    text(
                        "INSERT INTO jobs (id, status, dataset_id, algorithm, n_components, "
                        "params, fit_intercept, holdout_fraction, attempts, max_attempts, "
                        "cancel_requested, progress_fraction, created_at, idempotency_key, "
                        "api_key_id, warnings) VALUES (:id, 'queued', 'd1', 'am', 2, '{}', :true, "
                        "0.2, 0, 3, :false, 0.0, :at, :key, :owner, '[]')"
                    ),
                    {
                        "id": job_id,
                        "key": key,
                        "owner": owner,
                        "at": f"2030-01-01T12:0{minute}:00+00:00",
                        "true": True,
                        "false": False,
                    },
                )

        migrate.upgrade(database_url, "0006")
        with engine.connect() as connection:
            jobs = connection.execute(
                text("SELECT id, idempotency_scope, idempotency_key FROM jobs ORDER BY id")
            ).all()
            dataset = connection.execute(
                text("SELECT idempotency_scope, idempotency_key FROM datasets")
            ).one()
        assert [tuple(job) for job in jobs] == [
            ("j1", "keyA", "fit-1"),
            ("j2", "", "fit-2"),
            ("j3", None, None),
        ]
        assert tuple(dataset) == ("", "upload-1")

        # Another caller reuses j1's key; a downgrade keeps the key on the older job only.
        with engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE jobs SET idempotency_key = 'fit-1', idempotency_scope = 'keyB' "
                    "WHERE id = 'j3'"
                )
            )
        migrate.downgrade(database_url, "0005")
        with engine.connect() as connection:
            keys = connection.execute(text("SELECT id, idempotency_key FROM jobs ORDER BY id"))
            assert [tuple(row) for row in keys] == [("j1", "fit-1"), ("j2", "fit-2"), ("j3", None)]
    finally:
        engine.dispose()


def test_revision_0008_gives_old_datasets_no_extra_columns_and_its_downgrade_drops_them(
    database_url,
):
    migrate.upgrade(database_url, "0007")
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO datasets (id, n_rows, n_features, feature_names, created_at) "
                    "VALUES ('d1', 1, 1, '[\"x0\"]', :at)"
                ),
                {"at": "2030-01-01T12:00:00+00:00"},
            )
            connection.execute(
                text(
                    "INSERT INTO dataset_chunks (dataset_id, position, n_rows, x_data, y_data) "
                    "VALUES ('d1', 0, 1, :x, :y)"
                ),
                {"x": b"\x00" * 8, "y": b"\x00" * 8},
            )

        migrate.upgrade(database_url, "0008")
        with engine.begin() as connection:
            extra = connection.execute(text("SELECT extra_columns FROM datasets")).scalar_one()
            assert (json.loads(extra) if isinstance(extra, str) else extra) == []
            assert connection.execute(text("SELECT extra_data FROM dataset_chunks")).one() == (
                None,
            )
            connection.execute(
                text('UPDATE datasets SET extra_columns = \'[{"name": "g", "type": "string"}]\'')
            )
            connection.execute(text("UPDATE dataset_chunks SET extra_data = :data"), {"data": b"x"})

        migrate.downgrade(database_url, "0007")
        columns = {column["name"] for column in inspect(engine).get_columns("datasets")}
        chunk_columns = {column["name"] for column in inspect(engine).get_columns("dataset_chunks")}
        assert "extra_columns" not in columns
        assert "extra_data" not in chunk_columns
        with engine.connect() as connection:
            assert connection.execute(
                text("SELECT dataset_id, n_rows, x_data FROM dataset_chunks")
            ).one() == ("d1", 1, b"\x00" * 8)
    finally:
        engine.dispose()


def _grouped_model(session, dataset_id: str, labels) -> str:
    return model_store.create_model(
        session,
        model_store.ModelRecord(
            job_id=None,
            dataset_id=dataset_id,
            name=None,
            algorithm="am-classic",
            n_components=2,
            n_features=1,
            feature_names=["x0"],
            fit_intercept=True,
            params={},
            seed=0,
            coef=[[1.0], [-1.0]],
            intercept=[0.0, 1.0],
            shares=[0.5, 0.5],
            train_min_loss=0.1,
            holdout_min_loss=None,
            baseline={"coef": [0.0], "intercept": 0.0, "train_min_loss": 1.0},
            n_train=4,
            n_holdout=0,
            loss_history=[0.1],
            n_iter=1,
            fit_seconds=0.1,
            weights_column="w",
            groups_column="user",
            group_labels=labels,
            group_lines=np.arange(len(labels)) % 2,
            group_metrics={"n_groups_train": len(labels)},
        ),
    ).id


def test_revision_0009_stores_a_group_table_and_its_downgrade_keeps_the_models(database_url):
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    try:
        factory = make_sessionmaker(engine)
        with session_scope(factory) as session:
            dataset = dataset_store.create_dataset(
                session,
                X=np.zeros((4, 1)),
                y=np.zeros(4),
                feature_names=None,
                target_name=None,
                name=None,
            )
            text_labels = np.array([f"user-{i}" for i in range(10**5)])
            model_id = _grouped_model(session, dataset.id, text_labels)
            number_id = _grouped_model(session, dataset.id, np.array([-2.5, 3.0, 7.0]))
        with session_scope(factory) as session:
            labels, lines, posteriors = model_store.load_group_table(session, model_id=model_id)
            assert posteriors is None
            np.testing.assert_array_equal(labels, text_labels)
            np.testing.assert_array_equal(lines, np.arange(10**5) % 2)
            stored = session.scalar(
                text("SELECT group_table FROM models WHERE id = :id"), {"id": model_id}
            )
            # A table of 10^5 groups takes a few bytes per group, not a JSON row each.
            assert len(stored) < 4 * 10**5
            numbers, _, _ = model_store.load_group_table(session, model_id=number_id)
            np.testing.assert_array_equal(numbers, [-2.5, 3.0, 7.0])

        migrate.downgrade(database_url, "0008")
        model_columns = {column["name"] for column in inspect(engine).get_columns("models")}
        job_columns = {column["name"] for column in inspect(engine).get_columns("jobs")}
        assert not {"weights_column", "groups_column", "group_table", "group_metrics"} & (
            model_columns | job_columns
        )
        with engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM models")).scalar_one() == 2

        migrate.upgrade(database_url)
        with session_scope(factory) as session:
            assert model_store.load_group_table(session, model_id=model_id) is None
    finally:
        engine.dispose()


def test_revision_0011_keeps_rows_and_adds_null_standard_errors(database_url):
    migrate.upgrade(database_url, "0007")
    engine = make_engine(database_url)
    at = "2030-01-01T12:00:00+00:00"
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO jobs (id, status, dataset_id, algorithm, n_components, params, "
                    "fit_intercept, holdout_fraction, attempts, max_attempts, cancel_requested, "
                    "progress_fraction, created_at, model_id, warnings) VALUES ('j1', "
                    "'succeeded', 'd1', 'am', 1, '{}', :true, 0.2, 1, 3, :false, 1.0, :at, "
                    "'m1', '[]')"
                ),
                {"true": True, "false": False, "at": at},
            )
            connection.execute(
                text(
                    "INSERT INTO models (id, job_id, dataset_id, algorithm, n_components, "
                    "n_features, feature_names, fit_intercept, params, coef, intercept, shares, "
                    "train_min_loss, baseline, n_train, n_holdout, loss_history, n_iter, "
                    "fit_seconds, created_at, warnings) VALUES ('m1', 'j1', 'd1', 'am', 1, 1, "
                    "'[\"x0\"]', :true, '{}', '[[2.5]]', '[0.5]', '[1.0]', 0.25, '{}', 1, 0, "
                    "'[0.25]', 1, 0.01, :at, '[]')"
                ),
                {"true": True, "at": at},
            )

        migrate.upgrade(database_url, "0011")
        with engine.begin() as connection:
            assert connection.execute(text("SELECT uncertainty FROM jobs")).one() == (None,)
            assert connection.execute(text("SELECT uncertainty FROM models")).one() == (None,)
            connection.execute(
                text("UPDATE models SET uncertainty = :value"),
                {"value": json.dumps({"method": "observed-information", "components": []})},
            )

        migrate.downgrade(database_url, "0007")
        columns = {
            table: {column["name"] for column in inspect(engine).get_columns(table)}
            for table in ("jobs", "models")
        }
        assert "uncertainty" not in columns["jobs"] | columns["models"]
        with engine.connect() as connection:
            assert connection.execute(text("SELECT id, train_min_loss FROM models")).one() == (
                "m1",
                0.25,
            )
    finally:
        engine.dispose()


def test_revision_0010_gives_old_jobs_and_models_no_gate_and_its_downgrade_drops_it(
    database_url,
):
    migrate.upgrade(database_url, "0008")
    engine = make_engine(database_url)
    at = "2030-01-01T12:00:00+00:00"
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO datasets (id, n_rows, n_features, feature_names, created_at, "
                    "extra_columns) VALUES ('d1', 1, 1, '[\"x0\"]', :at, '[]')"
                ),
                {"at": at},
            )
            connection.execute(
                text(
                    "INSERT INTO jobs (id, status, dataset_id, algorithm, n_components, params, "
                    "fit_intercept, holdout_fraction, attempts, max_attempts, cancel_requested, "
                    "progress_fraction, created_at, model_id, warnings) VALUES ('j1', "
                    "'succeeded', 'd1', 'am', 1, '{}', :true, 0.2, 1, 3, :false, 1.0, :at, "
                    "'m1', '[]')"
                ),
                {"true": True, "false": False, "at": at},
            )
            connection.execute(
                text(
                    "INSERT INTO models (id, job_id, dataset_id, algorithm, n_components, "
                    "n_features, feature_names, fit_intercept, params, coef, intercept, shares, "
                    "train_min_loss, baseline, n_train, n_holdout, loss_history, n_iter, "
                    "fit_seconds, created_at, warnings) VALUES ('m1', 'j1', 'd1', 'am', 1, 1, "
                    "'[\"x0\"]', :true, '{}', '[[2.5]]', '[0.5]', '[1.0]', 0.25, '{}', 1, 0, "
                    "'[0.25]', 1, 0.01, :at, '[]')"
                ),
                {"true": True, "at": at},
            )

        migrate.upgrade(database_url, "0010")
        with engine.begin() as connection:
            assert connection.execute(text("SELECT gating FROM jobs")).one() == (None,)
            assert connection.execute(text("SELECT gate FROM models")).one() == (None,)
            connection.execute(text("UPDATE jobs SET gating = '[\"w\"]'"))
            connection.execute(text("UPDATE models SET gate = '{\"coef\": [[0.0]]}'"))
            gating = connection.execute(text("SELECT gating FROM jobs")).scalar_one()
            assert (json.loads(gating) if isinstance(gating, str) else gating) == ["w"]

        migrate.downgrade(database_url, "0008")
        assert "gating" not in {column["name"] for column in inspect(engine).get_columns("jobs")}
        assert "gate" not in {column["name"] for column in inspect(engine).get_columns("models")}
        with engine.connect() as connection:
            assert connection.execute(text("SELECT id, coef FROM models")).one()[0] == "m1"
    finally:
        engine.dispose()


def test_revision_0012_stores_keyed_chunks_with_their_model_and_its_downgrade_drops_them(
    database_url,
):
    # The shard claims of revision 0016 are how shards are stored: up to the head, then down.
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with Session(engine) as session, session.begin():
            dataset = dataset_store.create_dataset(
                session,
                X=np.zeros((4, 1)),
                y=np.zeros(4),
                feature_names=["x0"],
                target_name=None,
                name=None,
            )
            model = model_store.create_model(
                session,
                model_store.ModelRecord(
                    job_id=None,
                    dataset_id=dataset.id,
                    name=None,
                    algorithm="auto",
                    n_components=1,
                    n_features=1,
                    feature_names=["x0"],
                    fit_intercept=True,
                    params={},
                    seed=0,
                    coef=[[1.0]],
                    intercept=[0.0],
                    shares=[1.0],
                    train_min_loss=0.0,
                    holdout_min_loss=None,
                    baseline={"coef": [1.0], "intercept": 0.0, "train_min_loss": 0.0},
                    n_train=4,
                    n_holdout=0,
                    loss_history=[0.0],
                    n_iter=1,
                    fit_seconds=0.0,
                    split_by="account",
                    keyed_summary={"n_keys": 2},
                ),
            )
            job = job_store.create_job(
                session,
                job_store.JobRecord(
                    dataset_id=dataset.id,
                    algorithm="auto",
                    n_components=1,
                    params={},
                    fit_intercept=True,
                    holdout_fraction=0.0,
                    max_attempts=2,
                    split_by="account",
                    keys_per_shard=1,
                ),
            )
            job_store.claim_job(session, job_id=job.id, worker_id="w", now=utcnow())
            rows = [np.array([0, 1, 2]), np.array([3])]
            assert shard_store.plan_job_shards(
                session, job_id=job.id, shards=[(1, rows[0]), (1, rows[1])]
            )
            # A plan is made once per job.
            assert not shard_store.plan_job_shards(session, job_id=job.id, shards=[])
            now = utcnow()
            claims = [
                shard_store.claim_job_shard(
                    session, job_id=job.id, claimant=claimant, now=now, stale_before=now
                )
                for claimant in ("a", "b")
            ]
            assert [(c.position, c.rows.tolist()) for c in claims if c is not None] == [
                (0, [0, 1, 2]),
                (1, [3]),
            ]
            # Both are held and fresh: nothing is free until a heartbeat is stale.
            assert (
                shard_store.claim_job_shard(
                    session, job_id=job.id, claimant="c", now=now, stale_before=now
                )
                is None
            )
            later = now + timedelta(seconds=10)
            assert shard_store.beat_job_shards(session, job_id=job.id, claimant="a", now=later)
            stolen = shard_store.claim_job_shard(
                session, job_id=job.id, claimant="c", now=later, stale_before=later
            )
            assert stolen is not None and stolen.position == 1
            for position, keys, claimant in ((0, ["a"], "a"), (1, ["b"], "c")):
                assert shard_store.store_job_shard(
                    session,
                    job_id=job.id,
                    position=position,
                    claimant=claimant,
                    worker_id=f"worker-{claimant}",
                    arrays={"keys": np.array(keys), "coef": np.full((1, 1, 1), 2.0 + position)},
                )
            # The claimant whose claim went stale stores nothing; a shard is stored once.
            assert not shard_store.store_job_shard(
                session,
                job_id=job.id,
                position=1,
                claimant="b",
                worker_id="worker-b",
                arrays={"keys": np.array(["b"]), "coef": np.full((1, 1, 1), 9.0)},
            )
            counts = shard_store.job_shard_counts(session, job_id=job.id)
            assert (counts.n_shards, counts.done, counts.keys_done) == (2, 2, 2)
            assert shard_store.stored_job_shards(session, job_id=job.id) == [0, 1]
            shard_store.publish_job_shards(session, job_id=job.id, model_id=model.id)
            assert shard_store.stored_job_shards(session, job_id=job.id) == []
            assert shard_store.job_shard_counts(session, job_id=job.id).n_shards == 0
            model_id, job_id = model.id, job.id
        with Session(engine) as session:
            arrays = model_store.load_keyed_arrays(session, model_id=model_id)
            assert arrays["keys"].tolist() == ["a", "b"]
            assert arrays["coef"].ravel().tolist() == [2.0, 3.0]
            with pytest.raises(ValueError, match="objects"):
                shard_store.store_job_shard(
                    session,
                    job_id=job_id,
                    position=2,
                    claimant="a",
                    worker_id="w",
                    arrays={"keys": np.array([None])},
                )

        migrate.downgrade(database_url, "0008")
        assert not {
            "keyed_model_chunks",
            "keyed_job_shards",
            "keyed_job_shard_claims",
        } & table_names(database_url)
        assert "split_by" not in {c["name"] for c in inspect(engine).get_columns("models")}
        assert "split_by" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
        migrate.upgrade(database_url, "0012")
        assert "keyed_model_chunks" in table_names(database_url)
    finally:
        engine.dispose()


NEWEST_FIRST_INDEXES = {
    table: f"ix_{table}_created_at_id" for table in ("datasets", "jobs", "models")
}


def newest_first_indexes(url: str) -> dict[str, list[str]]:
    """The (created_at, id) indexes of revision 0013 found on each table, with their columns."""
    engine = make_engine(url)
    try:
        inspector = inspect(engine)
        return {
            table: index["column_names"]
            for table, name in NEWEST_FIRST_INDEXES.items()
            for index in inspector.get_indexes(table)
            if index["name"] == name
        }
    finally:
        engine.dispose()


def test_revision_0013_pages_newest_first_from_an_index_and_its_downgrade_keeps_rows(
    database_url,
):
    migrate.upgrade(database_url, "0007")
    assert newest_first_indexes(database_url) == {}
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:
            for number in range(3):
                connection.execute(
                    text(
                        "INSERT INTO datasets (id, n_rows, n_features, feature_names, created_at)"
                        " VALUES (:id, 1, 1, '[\"x0\"]', :at)"
                    ),
                    {"id": f"d{number}", "at": f"2030-01-0{number + 1}T12:00:00+00:00"},
                )

        migrate.upgrade(database_url)
        assert newest_first_indexes(database_url) == {
            "datasets": ["created_at", "id"],
            "jobs": ["created_at", "id"],
            "models": ["created_at", "id"],
        }
        with engine.connect() as connection:
            newest = "SELECT id FROM datasets ORDER BY created_at DESC, id DESC LIMIT 2"
            assert list(connection.scalars(text(newest))) == ["d2", "d1"]
            if database_url.startswith("sqlite"):
                # The page is read from the index: no sort of the whole table.
                plan = " ".join(
                    str(row[-1])
                    for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {newest}")
                )
                assert "ix_datasets_created_at_id" in plan and "TEMP B-TREE" not in plan, plan

        migrate.downgrade(database_url, "0007")
        assert newest_first_indexes(database_url) == {}
        with engine.connect() as connection:
            assert connection.scalar(text("SELECT count(*) FROM datasets")) == 3
    finally:
        engine.dispose()
    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()
