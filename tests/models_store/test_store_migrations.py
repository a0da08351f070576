"""Alembic owns the schema: up, down and up again, and the models agree with the migrations."""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from models_store import Base, migrate
from models_store.session import make_engine

APP_TABLES = {"datasets", "jobs", "models"}


def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(database_url):
    assert migrate.current_revision(database_url) is None
    assert table_names(database_url) == set()

    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()
    assert table_names(database_url) == APP_TABLES

    migrate.downgrade(database_url)
    assert migrate.current_revision(database_url) is None
    assert table_names(database_url) == set()

    migrate.upgrade(database_url)
    migrate.upgrade(database_url)  # already at head: nothing to do
    assert migrate.current_revision(database_url) == migrate.head_revision()
    assert table_names(database_url) == APP_TABLES


def test_models_match_the_migrations(migrated_database_url):
    engine = make_engine(migrated_database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "compare_server_default": True}
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
            "uq_jobs_idempotency_key"
        ]
        assert {fk["name"] for fk in inspector.get_foreign_keys("models")} == {
            "fk_models_dataset_id_datasets",
            "fk_models_job_id_jobs",
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
