"""Idempotent uploads: ``POST /datasets`` with an ``Idempotency-Key`` stores a dataset once.

The same key from the same caller (its API key; callers without a key share one scope) with the
same upload (the same rows, names and target, whatever the format they came in) answers with the
dataset stored the first time; with another upload it is a conflict. Another caller's key of
the same name is another key.
The key and a hash of the upload are stored with the dataset in the unit of work that stores
its rows, so a concurrent retry loses on the unique key and finds the winner's dataset.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from models_store import datasets as dataset_store
from models_store.session import session_scope
from models_store.tables import Dataset
from service.data.datasets import Upload, store_upload
from service.errors import ConflictError

_HASH_BLOCK_ROWS = 65_536


@dataclass(frozen=True)
class StoredUpload:
    """The dataset of an upload; ``created`` is False when a retry found it."""

    dataset: Dataset
    created: bool


def upload_hash(upload: Upload) -> str:
    """SHA-256 of the staged rows (as little-endian float64), the names and the target."""
    staged = upload.staged
    digest = hashlib.sha256()
    header: dict[str, Any] = {
        "name": upload.name,
        "feature_names": staged.feature_names,
        "target_name": staged.target_name,
        "n_rows": staged.n_rows,
    }
    if staged.kept:
        header["extra_columns"] = staged.extra_columns
    digest.update(json.dumps(header, sort_keys=True).encode("utf-8", "surrogatepass"))
    if not staged.kept:
        for X, y in staged.blocks(_HASH_BLOCK_ROWS):
            digest.update(X.astype("<f8").tobytes())
            digest.update(y.astype("<f8").tobytes())
        return digest.hexdigest()
    for X, y, extra in staged.with_extras():
        digest.update(X.astype("<f8").tobytes())
        digest.update(y.astype("<f8").tobytes())
        for values in extra.values():
            if values.dtype == object:  # texts as JSON, a missing value as null
                digest.update(json.dumps(values.tolist()).encode("utf-8", "surrogatepass"))
            else:
                digest.update(values.astype("<f8").tobytes())
    return digest.hexdigest()


def _replay(dataset: Dataset, digest: str, key: str) -> StoredUpload:
    if dataset.request_hash != digest:
        raise ConflictError(
            f"Idempotency-Key '{key}' was already used for a different upload (dataset "
            f"{dataset.id}); use a new key for a new upload"
        )
    return StoredUpload(dataset=dataset, created=False)


def _stored_with_key(
    session_factory: sessionmaker[Session], api_key_id: str | None, key: str
) -> Dataset | None:
    session: Session
    with session_scope(session_factory) as session:
        dataset = dataset_store.get_dataset_by_idempotency_key(
            session, api_key_id=api_key_id, key=key
        )
        if dataset is not None:
            session.expunge(dataset)
        return dataset


def store_upload_once(
    session_factory: sessionmaker[Session],
    upload: Upload,
    *,
    idempotency_key: str | None,
    api_key_id: str | None,
) -> StoredUpload:
    """Store ``upload`` as a new dataset, unless ``idempotency_key`` names one the caller
    ``api_key_id`` stored already."""
    if idempotency_key is None:
        return StoredUpload(dataset=store_upload(session_factory, upload), created=True)
    digest = upload_hash(upload)
    existing = _stored_with_key(session_factory, api_key_id, idempotency_key)
    if existing is not None:
        return _replay(existing, digest, idempotency_key)
    try:
        dataset = store_upload(
            session_factory,
            upload,
            api_key_id=api_key_id,
            idempotency_key=idempotency_key,
            request_hash=digest,
        )
    except IntegrityError:
        # A concurrent request with the same key committed first.
        winner = _stored_with_key(session_factory, api_key_id, idempotency_key)
        if winner is None:
            raise
        return _replay(winner, digest, idempotency_key)
    return StoredUpload(dataset=dataset, created=True)
