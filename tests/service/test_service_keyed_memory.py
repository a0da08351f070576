"""A keyed job's own process holds a shard and the global model's sample, never every row: the
shards are planned from the key column read chunk by chunk, the global model is fitted on a
bounded random sample, and each shard's rows are read from the chunks holding them."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from mixreg import service_support
from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store import models as model_store
from models_store.session import session_scope
from service.jobs.fit_spec import holdout_split
from service.jobs.shards import keyed_global_sample, plan_shards
from service.jobs.training import run_job

N_ACCOUNTS = 400
ROWS_PER_ACCOUNT = 50
N_ROWS = N_ACCOUNTS * ROWS_PER_ACCOUNT  # 20,000
CHUNK_ROWS = 500  # 40 chunks
KEYS_PER_SHARD = 40  # 10 shards of 2,000 rows
GLOBAL_ROWS = 1_000


@pytest.mark.parametrize("n_rows", [1, 999, 1_000])
def test_a_dataset_within_the_sample_size_is_sampled_whole_on_the_usual_split(n_rows):
    rows, held = keyed_global_sample(n_rows, 0.2, 7, max_rows=1_000)
    np.testing.assert_array_equal(rows, np.arange(n_rows))
    train, holdout = holdout_split(n_rows, 0.2, 7)
    np.testing.assert_array_equal(np.flatnonzero(~held), train)
    np.testing.assert_array_equal(np.flatnonzero(held), holdout)


def test_a_larger_dataset_is_sampled_at_random_and_keeps_each_rows_side_of_the_split():
    rows, held = keyed_global_sample(100_000, 0.25, 3, max_rows=5_000)
    assert rows.size == 5_000 and np.all(np.diff(rows) > 0)
    _, holdout = holdout_split(100_000, 0.25, 3)
    np.testing.assert_array_equal(held, np.isin(rows, holdout))
    # About a quarter held out, and rows from the whole dataset, not a stretch of it.
    assert 0.2 < held.mean() < 0.3
    assert rows[0] < 1_000 and rows[-1] > 99_000
    again, _ = keyed_global_sample(100_000, 0.25, 3, max_rows=5_000)
    np.testing.assert_array_equal(again, rows)
    other, _ = keyed_global_sample(100_000, 0.25, 4, max_rows=5_000)
    assert not np.array_equal(other, rows)


@pytest.mark.parametrize("text", [True, False])
def test_a_plan_from_blocks_of_keys_is_that_of_the_whole_column(text):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 57, size=3_001)
    if text:
        keys = np.array([f"k{code}" for code in codes], dtype=object)
        keys[rng.random(keys.size) < 0.05] = None
    else:
        keys = codes.astype(np.float64)
        keys[rng.random(keys.size) < 0.05] = np.nan
    blocks = np.array_split(keys, 7)

    plan = plan_shards(lambda: iter(blocks), 10)

    missing = service_support.missing_keys(keys)
    assert plan.rows_without_key == int(missing.sum())
    distinct = np.unique(service_support.key_array(keys[~missing]))
    np.testing.assert_array_equal(plan.distinct, distinct)
    assert [n_keys for n_keys, _ in plan.shards] == [10, 10, 10, 10, 10, distinct.size - 50]
    for position, (_, rows) in enumerate(plan.shards):
        mine = set(distinct[position * 10 : (position + 1) * 10].tolist())
        expected = [row for row in range(keys.size) if not missing[row] and keys[row] in mine]
        assert rows.tolist() == expected


@pytest.fixture
def accounts_job(db_sessionmaker, monkeypatch) -> str:
    """A claimed keyed job on 400 accounts of 50 rows each, stored by account in 40 chunks."""
    monkeypatch.setattr(dataset_store, "DATASET_CHUNK_BYTES", 8 * 3 * CHUNK_ROWS)
    rng = np.random.default_rng(1)
    account = np.repeat(np.arange(N_ACCOUNTS), ROWS_PER_ACCOUNT)
    X = rng.standard_normal((N_ROWS, 2))
    slopes = rng.standard_normal((N_ACCOUNTS, 2, 2))
    line = rng.integers(0, 2, size=N_ROWS)
    y = np.einsum("ij,ij->i", X, slopes[account, line]) + 0.05 * rng.standard_normal(N_ROWS)
    with session_scope(db_sessionmaker) as session:
        dataset = dataset_store.create_dataset(
            session,
            X=X,
            y=y,
            feature_names=None,
            target_name=None,
            name=None,
            extra={"account": account.astype(np.float64)},
        )
        job_store.create_job(
            session,
            job_store.JobRecord(
                dataset_id=dataset.id,
                algorithm="am",
                n_components=2,
                params={},
                fit_intercept=True,
                holdout_fraction=0.2,
                max_attempts=1,
                seed=0,
                split_by="account",
                keys_per_shard=KEYS_PER_SHARD,
            ),
        )
    with session_scope(db_sessionmaker) as session:
        return job_store.claim_next_job(session, worker_id="w1", now=datetime.now(UTC)).id


def test_a_keyed_jobs_process_never_holds_every_row(
    db_sessionmaker, migrated_database_url, accounts_job, monkeypatch
):
    rows_read: list[int] = []
    key_blocks: list[int] = []
    whole_reads: list[str] = []
    read_rows, iter_columns = dataset_store.read_dataset_rows, dataset_store.iter_dataset_columns

    def counted_read_rows(session, *, dataset, rows, column):
        rows_read.append(rows.size)
        return read_rows(session, dataset=dataset, rows=rows, column=column)

    def counted_iter_columns(session, *, dataset, names):
        for block in iter_columns(session, dataset=dataset, names=names):
            key_blocks.append(len(block[names[0]]))
            yield block

    def whole(name):
        def refuse(*args, **kwargs):
            whole_reads.append(name)
            raise AssertionError(f"{name} reads the whole dataset")

        return refuse

    monkeypatch.setattr(dataset_store, "read_dataset_rows", counted_read_rows)
    monkeypatch.setattr(dataset_store, "iter_dataset_columns", counted_iter_columns)
    for name in ("iter_dataset_blocks", "load_dataset_arrays", "load_dataset_columns"):
        monkeypatch.setattr(dataset_store, name, whole(name))

    status = run_job(
        accounts_job, migrated_database_url, worker_id="w1", keyed_global_rows=GLOBAL_ROWS
    )

    assert (status, whole_reads) == ("succeeded", [])
    # The global model's sample, then each of the 10 shards: 2,000 rows at most, of 20,000.
    assert rows_read == [GLOBAL_ROWS] + [KEYS_PER_SHARD * ROWS_PER_ACCOUNT] * 10
    # The key column, twice (distinct keys, then rows to shards), one chunk at a time.
    assert key_blocks == [CHUNK_ROWS] * (2 * N_ROWS // CHUNK_ROWS)
    with session_scope(db_sessionmaker) as session:
        job = job_store.get_job(session, job_id=accounts_job)
        model = model_store.get_model(session, model_id=job.model_id)
        # The global model is fitted and scored on its sample, each row on its side of the
        # job's split.
        _, held = keyed_global_sample(N_ROWS, 0.2, 0, GLOBAL_ROWS)
        assert (model.n_train, model.n_holdout) == (GLOBAL_ROWS - held.sum(), held.sum())
        assert job.keyed_summary["n_keys"] == N_ACCOUNTS
        assert job.keyed_summary["rows_without_key"] == 0


def test_a_keyed_jobs_progress_moves_with_the_rows_fitted(
    accounts_job, migrated_database_url, monkeypatch
):
    """The global model fitted on every row takes its rows' share of the bar (16,000 training
    rows beside the keys' 20,000), not a fixed tenth that then jumps."""
    reports: list[tuple[float, int | None]] = []
    update_progress = job_store.update_progress

    def recorded(session, **fields):
        reports.append((fields["fraction"], fields["keys_done"]))
        return update_progress(session, **fields)

    monkeypatch.setattr(job_store, "update_progress", recorded)
    status = run_job(
        accounts_job,
        migrated_database_url,
        worker_id="w1",
        keyed_global_rows=N_ROWS,
        progress_interval_s=0,
    )
    assert status == "succeeded"
    fractions = [fraction for fraction, _ in reports]
    assert fractions == sorted(fractions)
    share = 16_000 / (16_000 + N_ROWS)
    global_part = [fraction for fraction, keys_done in reports if keys_done is None]
    keyed_part = [fraction for fraction, keys_done in reports if keys_done is not None]
    assert global_part and max(global_part) <= share + 1e-12
    assert keyed_part[0] == pytest.approx(share) and keyed_part[-1] == pytest.approx(1.0)
