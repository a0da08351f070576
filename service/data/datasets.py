"""Uploaded datasets: receive the body by its type, read and check it in blocks, store it.

A file (multipart) or raw body is never held in memory: multipart files are spooled to disk
by the form parser and raw bodies are streamed to a temporary file; the parsers then read
them in blocks into a ``StagedDataset``, which is stored chunk by chunk in one unit of work
(docs/adr/0009-datasets-in-row-chunks.md).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import IO

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import UploadFile

from models_store import repository
from models_store.session import session_scope
from service.api.errors import DataTooLargeError, InvalidInputError, UnsupportedMediaTypeError
from service.api.schemas import DatasetIn, DatasetOut
from service.api.views import dataset_out
from service.config import Settings
from service.data import ingest, json_bodies

BinaryFile = IO[bytes]

_READERS: dict[
    str, Callable[[BinaryFile, str | None, ingest.DatasetLimits], ingest.StagedDataset]
] = {
    "csv": lambda source, target, limits: ingest.read_csv(source, target=target, limits=limits),
    "parquet": lambda source, target, limits: ingest.read_parquet(
        source, target=target, limits=limits
    ),
    "npz": lambda source, target, limits: ingest.read_npz(source, limits=limits),
}
_SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".npz": "npz"}
MEDIA_TYPES = {
    "text/csv": "csv",
    "application/csv": "csv",
    "application/vnd.apache.parquet": "parquet",
    "application/x-parquet": "parquet",
    "application/parquet": "parquet",
    "application/x-npz": "npz",
}
"""Media types of the file formats, accepted on multipart files and as raw bodies."""

ACCEPTED_FILES = "a .csv, .parquet or .npz file, or two .npy files in the form fields X and y"


def limits_of(settings: Settings) -> ingest.DatasetLimits:
    """The dataset size limits of ``settings``."""
    return ingest.DatasetLimits(max_rows=settings.max_rows, max_features=settings.max_features)


def file_format(*, filename: str | None, content_type: str | None) -> str:
    """``"csv"``, ``"parquet"`` or ``"npz"``, from the file name's suffix or else the media
    type."""
    suffix = PurePath(filename or "").suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    media_type = (content_type or "").split(";")[0].strip().lower()
    if media_type in MEDIA_TYPES:
        return MEDIA_TYPES[media_type]
    raise UnsupportedMediaTypeError(
        f"cannot tell the format of file '{filename or ''}' ({media_type or 'no media type'}); "
        f"upload {ACCEPTED_FILES}"
    )


def _reading(read: Callable[[], ingest.StagedDataset]) -> ingest.StagedDataset:
    """Run a parser; 413 past a size limit, 422 naming the row, column or array that is wrong."""
    try:
        return read()
    except ingest.DatasetTooLargeError as exc:
        raise DataTooLargeError(str(exc)) from None
    except ingest.IngestError as exc:
        raise InvalidInputError(str(exc)) from None


def read_file(
    source: BinaryFile, *, file_format: str, target: str | None, limits: ingest.DatasetLimits
) -> ingest.StagedDataset:
    """Read an uploaded file of a known format (``file_format``) into a staged dataset."""
    reader = _READERS[file_format]
    return _reading(lambda: reader(source, target, limits))


def read_npy_files(
    X_source: BinaryFile,
    y_source: BinaryFile,
    *,
    feature_names: Sequence[str] | None,
    limits: ingest.DatasetLimits,
) -> ingest.StagedDataset:
    """Read the ``.npy`` files ``X`` and ``y`` of a multipart upload into a staged dataset."""
    return _reading(
        lambda: ingest.read_npy_pair(X_source, y_source, feature_names=feature_names, limits=limits)
    )


def stage_parsed(
    parsed: ingest.ParsedDataset, *, limits: ingest.DatasetLimits
) -> ingest.StagedDataset:
    """Stage the arrays of a JSON dataset (already checked by its schema and converted)."""

    def read() -> ingest.StagedDataset:
        staged = ingest.StagedDataset(
            feature_names=parsed.feature_names, target_name=None, limits=limits
        )
        try:
            staged.append(parsed.X, parsed.y)
        except BaseException:
            staged.close()
            raise
        return staged

    return _reading(read)


@dataclass
class Upload:
    """A received upload: its checked rows (delete them with ``close``) and its name."""

    staged: ingest.StagedDataset
    name: str | None

    def close(self) -> None:
        """Delete the staged rows."""
        self.staged.close()


async def read_upload(
    request: Request, *, target: str | None, name: str | None, settings: Settings
) -> Upload:
    """The checked rows and name of an upload: a JSON body, a multipart file (or two ``.npy``
    files) or a raw CSV, Parquet or NPZ body.

    ``target`` and ``name`` are the query parameters (for raw bodies); reading and checking
    run in a worker thread so the event loop stays free.
    """
    limits = limits_of(settings)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        fields, parsed = await _read_json_dataset(request)
        staged = await run_in_threadpool(stage_parsed, parsed, limits=limits)
        return Upload(staged, fields.name)
    if content_type == "multipart/form-data":
        return await _read_multipart(request, limits=limits)
    if content_type in MEDIA_TYPES:
        with tempfile.TemporaryFile(prefix="mixreg-body-") as spool:
            await _spool(request, spool)
            staged = await run_in_threadpool(
                read_file,
                spool,
                file_format=MEDIA_TYPES[content_type],
                target=target,
                limits=limits,
            )
        return Upload(staged, name)
    raise UnsupportedMediaTypeError(
        f"Content-Type '{content_type or 'none'}' is not accepted; send application/json, "
        f"multipart/form-data with {ACCEPTED_FILES}, or a raw body of type "
        f"{', '.join(sorted(MEDIA_TYPES))}"
    )


async def _read_multipart(request: Request, *, limits: ingest.DatasetLimits) -> Upload:
    async with request.form() as form:
        upload = form.get("file")
        X_upload, y_upload = form.get("X"), form.get("y")
        form_target, form_name = form.get("target"), form.get("name")
        names = [value for value in form.getlist("feature_names") if isinstance(value, str)]
        target = form_target if isinstance(form_target, str) else None
        name = form_name if isinstance(form_name, str) else None
        if isinstance(upload, UploadFile):
            fmt = file_format(filename=upload.filename, content_type=upload.content_type)
            staged = await run_in_threadpool(
                read_file, upload.file, file_format=fmt, target=target, limits=limits
            )
            return Upload(staged, name)
        if isinstance(X_upload, UploadFile) and isinstance(y_upload, UploadFile):
            staged = await run_in_threadpool(
                read_npy_files,
                X_upload.file,
                y_upload.file,
                feature_names=names or None,
                limits=limits,
            )
            return Upload(staged, name)
        if isinstance(X_upload, UploadFile) or isinstance(y_upload, UploadFile):
            missing = "y" if isinstance(X_upload, UploadFile) else "X"
            raise InvalidInputError(
                f"multipart upload of .npy files needs both file fields X and y; {missing} is "
                f"missing"
            )
        raise InvalidInputError(f"multipart upload needs a file field 'file' ({ACCEPTED_FILES})")


SPOOL_WRITE_BYTES = 1024 * 1024
"""A raw body is written to its spool file in pieces of about this size, each in a worker
thread: the event loop never waits for the disk."""


async def _spool(request: Request, spool: IO[bytes]) -> None:
    """Write the body of ``request`` to ``spool`` and rewind it."""
    pending: list[bytes] = []
    size = 0
    async for part in request.stream():
        pending.append(part)
        size += len(part)
        if size >= SPOOL_WRITE_BYTES:
            await run_in_threadpool(spool.writelines, pending)
            pending, size = [], 0
    if pending:
        await run_in_threadpool(spool.writelines, pending)
    await run_in_threadpool(spool.seek, 0)


async def _read_json_dataset(request: Request) -> tuple[DatasetIn, ingest.ParsedDataset]:
    """The fields and arrays of a JSON dataset body; a big body is parsed in a child process
    (``service.data.json_bodies``), so the event loop goes on meanwhile."""
    body = await request.body()
    if not body:
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        if len(body) > json_bodies.PARSE_IN_A_CHILD_BYTES:
            parsed = await json_bodies.parse_dataset_body_in_a_child(body)
        else:
            parsed = json_bodies.parse_dataset_body(body)
    except ingest.DatasetTooLargeError as exc:
        raise DataTooLargeError(str(exc)) from None
    except ingest.IngestError as exc:
        raise InvalidInputError(str(exc)) from None
    if isinstance(parsed, list):
        raise RequestValidationError(parsed)
    return parsed


def store_upload(
    session_factory: sessionmaker[Session],
    upload: Upload,
    *,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> DatasetOut:
    """Store the staged rows of ``upload`` as a new dataset; with ``idempotency_key`` (see
    ``service.data.idempotency``), an ``IntegrityError`` if that key was used before, and
    nothing stored.

    Each chunk is written in a short unit of work of its own, and the next block is read from
    the upload between them, so no transaction (on SQLite: the write lock) lasts as long as the
    upload. The dataset is invisible until its last unit of work gives it its rows, and is
    deleted if storing it fails.
    """
    staged = upload.staged
    with session_scope(session_factory) as session:
        dataset = repository.start_dataset(
            session,
            n_features=staged.n_features,
            feature_names=staged.feature_names,
            target_name=staged.target_name,
            name=upload.name,
        )
    try:
        n_rows = 0
        for X, y in staged.blocks(repository.dataset_chunk_rows(staged.n_features)):
            with session_scope(session_factory) as session:
                n_rows += repository.add_dataset_chunk(session, dataset=dataset, X=X, y=y)
        with session_scope(session_factory) as session:
            dataset = repository.complete_dataset(session, dataset=dataset, n_rows=n_rows)
            if idempotency_key is not None and request_hash is not None:
                repository.set_dataset_idempotency_key(
                    session, dataset=dataset, key=idempotency_key, request_hash=request_hash
                )
            return dataset_out(dataset)
    except BaseException:
        with session_scope(session_factory) as session:
            repository.delete_incomplete_dataset(session, dataset_id=dataset.id)
        raise
