"""Engines and units of work: SQLite set up for several processes; failures leave nothing."""

from __future__ import annotations

import sqlite3
import time

import numpy as np
import pytest
from sqlalchemy import make_url
from sqlalchemy.exc import IntegrityError, StatementError

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.migrate import upgrade
from models_store.session import (
    SQLITE_BUSY_TIMEOUT_S,
    make_engine,
    make_sessionmaker,
    read_scope,
    session_scope,
)


def test_sqlite_connections_are_configured_for_concurrent_processes(sqlite_url):
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as connection:
            pragma = {
                name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()
                for name in ("journal_mode", "busy_timeout", "foreign_keys", "synchronous")
            }
    finally:
        engine.dispose()
    # synchronous: 1 is NORMAL
    assert pragma == {
        "journal_mode": "wal",
        "busy_timeout": 30000,
        "foreign_keys": 1,
        "synchronous": 1,
    }


def test_sqlite_write_transactions_take_the_write_lock_when_they_begin(sqlite_url):
    upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    other = sqlite3.connect(make_url(sqlite_url).database, timeout=0, isolation_level=None)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            # Only a read so far, yet the unit of work already holds the write lock.
            assert job_store.list_jobs(session, status=None, limit=1, offset=0) == ([], 0)
            with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
        engine.dispose()


def test_sqlite_reads_neither_take_nor_wait_for_the_write_lock(sqlite_url):
    upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    factory = make_sessionmaker(engine)
    with session_scope(factory) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=np.ones((2, 1)),
            y=np.ones(2),
            feature_names=None,
            target_name=None,
            name=None,
        )
        job_id = job_store.create_job(
            session,
            job_store.JobRecord(
                dataset_id=dataset.id,
                algorithm="am",
                n_components=1,
                params={},
                fit_intercept=True,
                holdout_fraction=0.0,
                max_attempts=1,
            ),
        ).id
    writer = sqlite3.connect(make_url(sqlite_url).database, timeout=0, isolation_level=None)
    try:
        with read_scope(factory) as session:
            jobs, _ = job_store.list_jobs(session, status=None, limit=5, offset=0)
            assert [job.id for job in jobs] == [job_id]
            # A writer gets the lock while the read goes on ...
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("UPDATE jobs SET name = 'renamed'")
            # ... and the read keeps its snapshot.
            job = job_store.get_job(session, job_id=job_id)
            assert job is not None and job.name is None
        started = time.monotonic()
        with read_scope(factory) as session:
            # The writer still holds the lock: a read neither waits for it nor sees its change.
            job = job_store.get_job(session, job_id=job_id)
            assert job is not None and job.name is None
        assert time.monotonic() - started < SQLITE_BUSY_TIMEOUT_S / 2
        writer.execute("COMMIT")
        with read_scope(factory) as session:
            job = job_store.get_job(session, job_id=job_id)
            assert job is not None and job.name == "renamed"
    finally:
        writer.close()
        engine.dispose()


def test_an_exception_in_the_unit_of_work_leaves_nothing_written(db_sessionmaker, make_job):
    with (
        pytest.raises(RuntimeError, match="fit exploded"),
        session_scope(db_sessionmaker) as session,
    ):
        dataset = dataset_store.create_dataset(
            session, X=np.ones((2, 1)), y=np.ones(2), feature_names=None, target_name=None, name="x"
        )
        make_job(session, dataset_id=dataset.id)
        raise RuntimeError("fit exploded")

    with session_scope(db_sessionmaker) as session:
        datasets, _ = dataset_store.list_datasets(session, limit=10, offset=0)
        assert [d.name for d in datasets] == ["small"]  # only the fixture's dataset
        assert job_store.list_jobs(session, status=None, limit=10, offset=0) == ([], 0)


def test_a_failed_statement_rolls_back_the_earlier_writes_of_its_unit(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        make_job(session, idempotency_key="taken")

    with pytest.raises(IntegrityError), session_scope(db_sessionmaker) as session:
        dataset_store.create_dataset(
            session, X=np.ones((2, 1)), y=np.ones(2), feature_names=None, target_name=None, name="y"
        )
        make_job(session, idempotency_key="taken")

    with session_scope(db_sessionmaker) as session:
        assert dataset_store.list_datasets(session, limit=10, offset=0)[1] == 1
        assert job_store.list_jobs(session, status=None, limit=10, offset=0)[1] == 1


def test_make_engine_does_not_connect():
    engine = make_engine("postgresql+psycopg://nobody@127.0.0.1:1/nowhere")
    engine.dispose()


def test_non_finite_json_is_refused_by_the_engine(db_sessionmaker, make_job):
    with session_scope(db_sessionmaker) as session:
        job = make_job(session)
        job.params = {"step_size": float("nan")}
        # SQLite serializes in SQLAlchemy (wrapped in StatementError), psycopg in the driver.
        with pytest.raises((StatementError, ValueError), match="not JSON compliant"):
            session.flush()
