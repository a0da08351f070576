"""Keyed fits of hostile key columns: text keys are stored as UTF-8 bytes and offsets (never at
the width of the longest key) and chunks stored fixed-width are still read; a key longer than
MIXREG_MAX_KEY_CHARS, or more coefficients than MIXREG_MAX_KEYED_COEFFICIENTS, fails the fit
with an error naming them before anything is stored; the model cache is bounded in bytes."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from models_store import jobs as job_store
from models_store import models as model_store
from models_store.codecs import decode_arrays, encode_arrays
from models_store.session import session_scope
from models_store.tables import KeyedJobShard, KeyedJobShardClaim, KeyedModelChunk
from service.config import Settings
from service.jobs.training import run_job
from service.serving.prediction import ModelCache, StoredLines, keyed_lines, positions_of

LONG_KEY = "k" * 250  # as long as a predict request's key may be


def test_text_keys_are_stored_as_bytes_and_offsets_whatever_the_longest():
    keys = np.array([f"acct-{i}" for i in range(2000)] + ["é" * 100_000], dtype=object)
    encoded = encode_arrays({"keys": keys, "n_rows": np.arange(keys.size)})
    # Fixed-width text would take 2,001 x 400,000 bytes.
    assert len(encoded) < 250_000
    decoded = decode_arrays(encoded)
    assert decoded["keys"].dtype == object
    assert decoded["keys"].tolist() == keys.tolist()
    np.testing.assert_array_equal(decoded["n_rows"], np.arange(keys.size))


def test_a_fixed_width_blob_stored_before_still_decodes():
    buffer = io.BytesIO()
    np.savez(buffer, keys=np.array(["a", "bb", "ccc"]), coef=np.ones((3, 2, 1)))
    decoded = decode_arrays(buffer.getvalue())
    assert decoded["keys"].tolist() == ["a", "bb", "ccc"]
    assert decoded["coef"].shape == (3, 2, 1)


def test_damaged_text_offsets_are_refused():
    arrays = decode_arrays(encode_arrays({"keys": np.array(["ab", "c"], dtype=object)}))
    assert arrays["keys"].tolist() == ["ab", "c"]
    buffer = io.BytesIO()
    np.savez(
        buffer,
        **{"keys.utf8": np.frombuffer(b"abc", np.uint8), "keys.offsets": np.array([0, 5, 3])},
    )
    with pytest.raises(ValueError, match="stored text 'keys' is damaged"):
        decode_arrays(buffer.getvalue())


def test_chunks_stored_fixed_width_and_compact_join_in_key_order():
    first = io.BytesIO()
    np.savez(first, keys=np.array(["a", "bb"]), n_rows=np.array([1, 2]))
    second = encode_arrays({"keys": np.array(["c" * 50, "d"], dtype=object), "n_rows": [3, 4]})
    parts = [decode_arrays(first.getvalue()), decode_arrays(second)]
    keys = np.concatenate([part["keys"] for part in parts])
    assert keys.tolist() == ["a", "bb", "c" * 50, "d"]
    assert keys.dtype == object


def claim(sessionmaker_: sessionmaker[Session]) -> str:
    with session_scope(sessionmaker_) as session:
        job = job_store.claim_next_job(session, worker_id="w", now=datetime.now(UTC))
        assert job is not None
        return job.id


def keyed_csv(keys: list[str], rows_per_key: int = 6) -> bytes:
    rng = np.random.default_rng(0)
    lines = ["x,y,acct"]
    for key in keys:
        slope = rng.standard_normal()
        for _ in range(rows_per_key):
            x = rng.standard_normal()
            lines.append(f"{x:.6f},{slope * x:.6f},{key}")
    return ("\n".join(lines) + "\n").encode()


def upload(client: TestClient, body: bytes) -> str:
    response = client.post(
        "/datasets",
        files={"file": ("d.csv", body, "text/csv")},
        data={"target": "y", "keep": "acct"},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def fit(
    client: TestClient,
    app_sessionmaker: sessionmaker[Session],
    settings: Settings,
    dataset_id: str,
    **limits: int,
) -> dict:
    response = client.post(
        "/fit",
        json={"dataset_id": dataset_id, "k": 1, "algorithm": "am", "split_by": "acct"},
    )
    assert response.status_code == 202, response.text
    job_id = claim(app_sessionmaker)
    run_job(job_id, settings.database_url, worker_id="w", **limits)
    job: dict = client.get(f"/jobs/{job_id}").json()
    return job


def test_a_keyed_fit_stores_long_text_keys_compactly_and_serves_them(
    client: TestClient, app_sessionmaker, settings
):
    keys = [f"acct-{i}" for i in range(1999)] + [LONG_KEY]
    dataset_id = upload(client, keyed_csv(keys, rows_per_key=2))
    job = fit(client, app_sessionmaker, settings, dataset_id)
    assert job["status"] == "succeeded", job
    with session_scope(app_sessionmaker) as session:
        stored = session.scalar(
            select(func.sum(func.length(KeyedModelChunk.data))).where(
                KeyedModelChunk.model_id == job["model_id"]
            )
        )
    # Keys at the width of the longest would take 2,000 x 1,000 bytes.
    assert 0 < stored < 400_000
    response = client.post(
        f"/models/{job['model_id']}/predict",
        json={"X": [[1.0], [1.0]], "keys": [LONG_KEY, "acct-7"], "unknown_keys": "error"},
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["predictions"]) == 2
    key_lines = client.get(f"/models/{job['model_id']}/keys/{LONG_KEY}")
    assert key_lines.status_code == 200, key_lines.text


def test_a_key_longer_than_the_limit_fails_the_fit_naming_column_row_and_setting(
    client: TestClient, app_sessionmaker, settings
):
    keys = ["a", "b", "c" * 300, "d"]
    dataset_id = upload(client, keyed_csv(keys))
    job = fit(client, app_sessionmaker, settings, dataset_id, max_key_chars=256)
    assert job["status"] == "failed"
    assert job["error"] == (
        "split_by: column 'acct' holds a key of 300 characters in row 12 (counted from 0); a key "
        "may hold at most 256 (MIXREG_MAX_KEY_CHARS)"
    )
    assert job["model_id"] is None
    with session_scope(app_sessionmaker) as session:
        assert session.scalar(select(func.count()).select_from(KeyedJobShardClaim)) == 0
        assert session.scalar(select(func.count()).select_from(KeyedJobShard)) == 0


def test_too_many_keyed_coefficients_fail_the_fit_naming_the_product_and_setting(
    client: TestClient, app_sessionmaker, settings
):
    dataset_id = upload(client, keyed_csv([f"u{i}" for i in range(30)]))
    job = fit(client, app_sessionmaker, settings, dataset_id, max_keyed_coefficients=20)
    assert job["status"] == "failed"
    assert "30 keys x k = 1 x 1 features make 30 coefficients" in job["error"]
    assert "MIXREG_MAX_KEYED_COEFFICIENTS" in job["error"]
    with session_scope(app_sessionmaker) as session:
        assert session.scalar(select(func.count()).select_from(KeyedJobShardClaim)) == 0


def test_the_settings_bound_keys_and_the_cache_bytes_by_default():
    settings = Settings()
    assert settings.max_key_chars == 256
    assert settings.max_keyed_coefficients == 50_000_000
    assert settings.model_cache_bytes == 1024**3


def keyed_stored_lines(model_id: str, n_keys: int, d: int = 10) -> StoredLines:
    keys = np.array([f"key-{i:08d}" for i in range(n_keys)], dtype=object)
    keyed = keyed_lines(
        {
            "keys": keys,
            "coef": np.zeros((n_keys, 2, d)),
            "intercept": np.zeros((n_keys, 2)),
            "shares": np.full((n_keys, 2), 0.5),
            "min_loss": np.zeros(n_keys),
            "n_rows": np.full(n_keys, 10),
            "status": np.zeros(n_keys, dtype=np.int8),
        }
    )
    return StoredLines(
        model_id,
        np.zeros((2, d)),
        np.zeros(2),
        split_by="acct",
        keyed=keyed,
        key_positions=positions_of(keyed),
    )


def test_a_keyed_models_bytes_count_its_keys_lines_and_lookup_table():
    lines = keyed_stored_lines("m", 10_000)
    # 10,000 keys x 2 lines x 10 features of float64 alone take 1.6 MB.
    assert 1_600_000 < lines.memory_bytes() < 4_000_000


def test_the_model_cache_is_bounded_by_bytes():
    small = keyed_stored_lines("small", 100)
    big = keyed_stored_lines("big", 10_000)
    huge = keyed_stored_lines("huge", 40_000)
    cache = ModelCache(capacity=100, max_bytes=big.memory_bytes() + 2 * small.memory_bytes())
    cache.put(small)
    cache.put(keyed_stored_lines("small2", 100))
    cache.put(big)
    assert cache.model_ids() == ["small", "small2", "big"]
    cache.put(keyed_stored_lines("small3", 100))
    # Past the bytes, the least recently used model goes.
    assert cache.model_ids() == ["small2", "big", "small3"]
    assert cache.bytes <= big.memory_bytes() + 2 * small.memory_bytes()
    # A model larger than the whole cache is served, not kept; the others stay.
    cache.put(huge)
    assert "huge" not in cache and cache.model_ids() == ["small2", "big", "small3"]
    cache.evict("big")
    assert cache.bytes == 2 * small.memory_bytes()


def test_a_keyed_model_stored_with_fixed_width_keys_is_still_served(
    client: TestClient, app_sessionmaker, settings
):
    keys = ["alpha", "b", "gamma-" + "g" * 40, "d"]
    dataset_id = upload(client, keyed_csv(keys))
    job = fit(client, app_sessionmaker, settings, dataset_id)
    assert job["status"] == "succeeded", job
    model_id = job["model_id"]
    with session_scope(app_sessionmaker) as session:
        chunks = session.scalars(
            select(KeyedModelChunk).where(KeyedModelChunk.model_id == model_id)
        ).all()
        assert chunks
        for chunk in chunks:
            arrays = decode_arrays(bytes(chunk.data))
            assert arrays["keys"].dtype == object
            # As chunks were stored before: the keys as fixed-width text.
            old_form = io.BytesIO()
            np.savez(old_form, **{**arrays, "keys": arrays["keys"].astype(str)})
            chunk.data = old_form.getvalue()
    with session_scope(app_sessionmaker) as session:
        loaded = model_store.load_keyed_arrays(session, model_id=model_id)
    assert loaded["keys"].tolist() == sorted(keys)
    assert loaded["keys"].dtype == object  # never padded to the longest key in memory
    at = sorted(keys).index(keys[2])
    response = client.post(
        f"/models/{model_id}/predict",
        json={"X": [[2.0]], "keys": [keys[2]], "unknown_keys": "error"},
    )
    assert response.status_code == 200, response.text
    expected = 2.0 * loaded["coef"][at][:, 0] + loaded["intercept"][at]
    np.testing.assert_allclose(response.json()["predictions"][0], expected)
