"""Uploaded datasets: receive the body by its type, read and check it in blocks, store it.

A file (multipart) or raw body is never held in memory: multipart files are spooled to disk
by the form parser and raw bodies are streamed to a temporary file; the readers of
:mod:`service.data.readers` (one per format) then read them in blocks into a ``StagedDataset``
(:mod:`service.data.staging`), which is stored chunk by chunk in one unit of work
(docs/adr/0009-datasets-in-row-chunks.md).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import IO, Any

import numpy as np
from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from numpy.typing import NDArray
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import UploadFile

from models_store import datasets as dataset_store
from models_store.session import session_scope
from models_store.tables import Dataset
from service import checks
from service.config import Settings
from service.data import ingest, json_bodies
from service.data.column_choice import ColumnChoice
from service.data.readers.csv import read_csv
from service.data.readers.npy import read_npy_pair
from service.data.readers.npz import read_npz
from service.data.readers.parquet import read_parquet
from service.data.staging import NUMBER, STRING, StagedDataset
from service.errors import (
    ConflictError,
    DataTooLargeError,
    InvalidInputError,
    NotFoundError,
    UnsupportedMediaTypeError,
)
from service.schemas import DatasetIn

BinaryFile = IO[bytes]


@dataclass(frozen=True)
class TableOptions:
    """How to read a CSV or Parquet upload: the column to predict, which columns are the
    features, and (CSV) the delimiter; none of them applies to NPZ or ``.npy`` arrays."""

    target: str | None = None
    features: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    delimiter: str | None = None
    keep: tuple[str, ...] = ()
    na: str = ingest.NA_ERROR

    def choice(self) -> ColumnChoice:
        """The feature columns asked for, and those kept beside them."""
        return ColumnChoice(features=self.features, ignore=self.ignore, keep=self.keep)

    def check_applies_to(self, file_format: str) -> None:
        """Raise if an option was given that a file of ``file_format`` has no use for."""
        given = [
            name
            for name, value, formats in (
                ("features", self.features, ("csv", "parquet")),
                ("ignore", self.ignore or None, ("csv", "parquet")),
                ("delimiter", self.delimiter, ("csv",)),
                ("na", None if self.na == ingest.NA_ERROR else self.na, ("csv",)),
            )
            if value is not None and file_format not in formats
        ]
        if given:
            raise checks.IngestError(
                f"{', '.join(given)} applies to named columns (CSV; features and ignore also "
                f"Parquet), not to a {file_format} upload"
            )


def listed_names(values: Sequence[str] | None) -> tuple[str, ...]:
    """Column names given as repeated values, each possibly a comma-separated list: the one
    rule of every list of names (features, ignore, keep, feature_names) in a form or query."""
    return tuple(
        name.strip() for value in values or () for name in value.split(",") if name.strip()
    )


def _texts(values: Sequence[Any]) -> list[str]:
    """The text values of a repeated form field (files are not names)."""
    return [value for value in values if isinstance(value, str)]


def _read_npz(
    source: BinaryFile, options: TableOptions, limits: ingest.DatasetLimits
) -> StagedDataset:
    """An NPZ archive; ``target`` names its array ``y`` (a DataFrame's target column, which
    the client uploads as NPZ), so predictions by the model can name it too."""
    staged = read_npz(source, limits=limits, keep=options.keep)
    if options.target is None:
        return staged
    try:
        checks.check_text(options.target, name="target")
        if not options.target or options.target in {*staged.feature_names, *staged.kept}:
            raise checks.IngestError(
                f"target '{options.target}' names the NPZ's array y, so it is neither empty, "
                f"a feature nor a kept column"
            )
    except BaseException:
        staged.close()
        raise
    staged.target_name = options.target
    return staged


_READERS: dict[str, Callable[[BinaryFile, TableOptions, ingest.DatasetLimits], StagedDataset]] = {
    "csv": lambda source, options, limits: read_csv(
        source,
        target=options.target,
        limits=limits,
        choice=options.choice(),
        delimiter=options.delimiter,
        na=options.na,
    ),
    "parquet": lambda source, options, limits: read_parquet(
        source, target=options.target, limits=limits, choice=options.choice()
    ),
    "npz": lambda source, options, limits: _read_npz(source, options, limits),
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
NPY_KEEPS_NOTHING = (
    "keep: extra columns need a CSV, Parquet, NPZ or JSON upload; two .npy files hold only X and y"
)


def limits_of(settings: Settings) -> ingest.DatasetLimits:
    """The dataset size limits of ``settings``."""
    return ingest.DatasetLimits(
        max_rows=settings.max_rows,
        max_features=settings.max_features,
        max_decoded_bytes=settings.max_decoded_bytes,
        max_text_cell_chars=settings.max_text_cell_chars,
    )


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


def _reading(read: Callable[[], StagedDataset]) -> StagedDataset:
    """Run a parser; 413 past a size limit, 422 naming the row, column or array that is wrong."""
    try:
        return read()
    except ingest.DatasetTooLargeError as exc:
        raise DataTooLargeError(str(exc)) from None
    except checks.IngestError as exc:
        raise InvalidInputError(str(exc)) from None


def read_file(
    source: BinaryFile,
    *,
    file_format: str,
    options: TableOptions,
    limits: ingest.DatasetLimits,
) -> StagedDataset:
    """Read an uploaded file of a known format (``file_format``) into a staged dataset."""
    reader = _READERS[file_format]

    def read() -> StagedDataset:
        options.check_applies_to(file_format)
        return reader(source, options, limits)

    return _reading(read)


def read_npy_files(
    X_source: BinaryFile,
    y_source: BinaryFile,
    *,
    feature_names: Sequence[str] | None,
    limits: ingest.DatasetLimits,
) -> StagedDataset:
    """Read the ``.npy`` files ``X`` and ``y`` of a multipart upload into a staged dataset."""
    return _reading(
        lambda: read_npy_pair(X_source, y_source, feature_names=feature_names, limits=limits)
    )


def stage_parsed(parsed: ingest.ParsedDataset, *, limits: ingest.DatasetLimits) -> StagedDataset:
    """Stage the arrays of a JSON dataset (already checked by its schema and converted)."""

    def read() -> StagedDataset:
        kept = {
            name: NUMBER if values.dtype == np.float64 else STRING
            for name, values in parsed.extra.items()
        }
        staged = StagedDataset(
            feature_names=parsed.feature_names, target_name=None, limits=limits, kept=kept
        )
        try:
            staged.append(parsed.X, parsed.y, parsed.extra)
        except BaseException:
            staged.close()
            raise
        return staged

    return _reading(read)


@dataclass
class Upload:
    """A received upload: its checked rows (delete them with ``close``) and its name."""

    staged: StagedDataset
    name: str | None

    def close(self) -> None:
        """Delete the staged rows."""
        self.staged.close()


async def read_upload(
    request: Request, *, options: TableOptions, name: str | None, settings: Settings
) -> Upload:
    """The checked rows and name of an upload: a JSON body, a multipart file (or two ``.npy``
    files) or a raw CSV, Parquet or NPZ body.

    ``options`` and ``name`` are the query parameters (for raw bodies; a multipart upload has
    them as form fields); reading and checking run in a worker thread so the event loop stays
    free.
    """
    limits = limits_of(settings)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        if options.keep:
            raise InvalidInputError(
                "keep names columns of a CSV, Parquet or NPZ upload; a JSON body gives its extra "
                "columns as columns: {name: [values...]}"
            )
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
                options=options,
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
        names = list(listed_names(_texts(form.getlist("feature_names"))))
        target = form_target if isinstance(form_target, str) else None
        name = form_name if isinstance(form_name, str) else None
        form_delimiter = form.get("delimiter")
        features = listed_names(_texts(form.getlist("features")))
        form_na = form.get("na")
        options = TableOptions(
            target=target,
            features=features or None,
            ignore=listed_names(_texts(form.getlist("ignore"))),
            delimiter=form_delimiter if isinstance(form_delimiter, str) else None,
            keep=listed_names(_texts(form.getlist("keep"))),
            na=form_na if isinstance(form_na, str) else ingest.NA_ERROR,
        )
        if isinstance(upload, UploadFile):
            fmt = file_format(filename=upload.filename, content_type=upload.content_type)
            staged = await run_in_threadpool(
                read_file, upload.file, file_format=fmt, options=options, limits=limits
            )
            return Upload(staged, name)
        if isinstance(X_upload, UploadFile) and isinstance(y_upload, UploadFile):
            if options.keep:
                raise InvalidInputError(NPY_KEEPS_NOTHING)
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
    except checks.IngestError as exc:
        raise InvalidInputError(str(exc)) from None
    if isinstance(parsed, list):
        raise RequestValidationError(parsed)
    return parsed


def store_upload(
    session_factory: sessionmaker[Session],
    upload: Upload,
    *,
    api_key_id: str | None = None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
) -> Dataset:
    """Store the staged rows of ``upload`` as a new dataset (its row, readable once the
    session is gone); with ``idempotency_key`` (see
    ``service.data.idempotency``), an ``IntegrityError`` if that key was used before, and
    nothing stored.

    Each chunk is written in a short unit of work of its own, and the next block is read from
    the upload between them, so no transaction (on SQLite: the write lock) lasts as long as the
    upload. The dataset is invisible until its last unit of work gives it its rows, and is
    deleted if storing it fails.
    """
    staged = upload.staged
    with session_scope(session_factory) as session:
        dataset = dataset_store.start_dataset(
            session,
            n_features=staged.n_features,
            feature_names=staged.feature_names,
            target_name=staged.target_name,
            name=upload.name,
            extra_columns=staged.extra_columns,
        )
    try:
        n_rows = 0
        for X, y, extra in stored_chunks(staged):
            with session_scope(session_factory) as session:
                n_rows += dataset_store.add_dataset_chunk(
                    session, dataset=dataset, X=X, y=y, extra=extra
                )
        with session_scope(session_factory) as session:
            dataset = dataset_store.complete_dataset(session, dataset=dataset, n_rows=n_rows)
            if idempotency_key is not None and request_hash is not None:
                dataset_store.set_dataset_idempotency_key(
                    session,
                    dataset=dataset,
                    api_key_id=api_key_id,
                    key=idempotency_key,
                    request_hash=request_hash,
                )
            return dataset
    except BaseException:
        with session_scope(session_factory) as session:
            dataset_store.delete_incomplete_dataset(session, dataset_id=dataset.id)
        raise


Chunk = tuple[ingest.FloatArray, ingest.FloatArray, dict[str, NDArray[Any]]]


def stored_chunks(staged: StagedDataset) -> Iterator[Chunk]:
    """The staged rows cut into the chunks they are stored as, with their kept values: at
    most ``models_store.datasets.DATASET_CHUNK_BYTES`` of features and kept values each (a text
    counted by its UTF-8 length), so a chunk of long texts holds fewer rows."""
    if not staged.kept:
        for X, y in staged.blocks(dataset_store.dataset_chunk_rows(staged.n_features)):
            yield X, y, {}
        return
    types = {column["name"]: column["type"] for column in staged.extra_columns}
    budget = dataset_store.DATASET_CHUNK_BYTES
    pending: list[Chunk] = []
    pending_bytes = 0
    for X, y, extra in staged.with_extras():
        pending.append((X, y, extra))
        pending_bytes += 8 * X.size + int(dataset_store.extra_row_bytes(len(y), extra, types).sum())
        if pending_bytes >= budget:
            *full, rest = _cut(pending, types, budget)
            yield from full
            pending = [rest]
            pending_bytes = 8 * rest[0].size + int(
                dataset_store.extra_row_bytes(len(rest[1]), rest[2], types).sum()
            )
    if pending:
        yield from _cut(pending, types, budget)


def _cut(pending: list[Chunk], types: Mapping[str, str], budget: int) -> list[Chunk]:
    """Consecutive blocks of rows joined, then cut into chunks of at most ``budget`` bytes."""
    X = np.concatenate([block[0] for block in pending])
    y = np.concatenate([block[1] for block in pending])
    extra = {name: np.concatenate([block[2][name] for block in pending]) for name in types}
    row_bytes = 8 * X.shape[1] + dataset_store.extra_row_bytes(len(y), extra, types)
    chunks: list[Chunk] = []
    start = 0
    for stop in dataset_store.chunk_stops(row_bytes, budget):
        chunks.append(
            (
                X[start:stop],
                y[start:stop],
                {name: values[start:stop] for name, values in extra.items()},
            )
        )
        start = int(stop)
    return chunks


def delete_dataset(session: Session, *, dataset_id: str) -> None:
    """Delete a dataset and its rows; 404 if there is none, 409 while a queued or running job
    fits it (the dataset is locked meanwhile, so no fit of it is queued in between)."""
    if dataset_store.lock_dataset(session, dataset_id=dataset_id, shared=False) is None:
        raise NotFoundError(f"dataset {dataset_id[:300]} does not exist")
    unfinished = dataset_store.unfinished_jobs_of_dataset(session, dataset_id=dataset_id)
    if unfinished:
        shown = ", ".join(unfinished[:5]) + (", ..." if len(unfinished) > 5 else "")
        raise ConflictError(
            f"dataset {dataset_id} is used by {len(unfinished)} queued or running "
            f"job{'s' if len(unfinished) > 1 else ''} ({shown}); cancel "
            f"{'them' if len(unfinished) > 1 else 'it'} (POST /jobs/{{id}}/cancel) or wait "
            f"until {'they finish' if len(unfinished) > 1 else 'it finishes'}"
        )
    dataset_store.delete_dataset(session, dataset_id=dataset_id)
