"""Uploaded datasets: read the body by its type, store the arrays in one unit of work."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import UploadFile

from models_store import repository
from models_store.session import session_scope
from service.api.errors import InvalidInputError, UnsupportedMediaTypeError
from service.api.schemas import DataIn, DatasetIn, DatasetOut
from service.api.views import dataset_out
from service.data import ingest

_READERS: dict[str, Callable[[bytes, str | None], ingest.ParsedDataset]] = {
    "csv": lambda data, target: ingest.parse_csv(data, target=target),
    "npz": lambda data, target: ingest.parse_npz(data),
}
_SUFFIXES = {".csv": "csv", ".npz": "npz"}
_MEDIA_TYPES = {"text/csv": "csv", "application/csv": "csv", "application/x-npz": "npz"}


def file_format(*, filename: str | None, content_type: str | None) -> str:
    """``"csv"`` or ``"npz"``, from the file name's suffix or else the media type."""
    suffix = PurePath(filename or "").suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    media_type = (content_type or "").split(";")[0].strip().lower()
    if media_type in _MEDIA_TYPES:
        return _MEDIA_TYPES[media_type]
    raise UnsupportedMediaTypeError(
        f"cannot tell the format of file '{filename or ''}' ({media_type or 'no media type'}); "
        f"upload a .csv or .npz file"
    )


def parse_file(
    data: bytes, *, filename: str | None, content_type: str | None, target: str | None
) -> ingest.ParsedDataset:
    """Read an uploaded file; 422 naming the row, column or array that is wrong."""
    reader = _READERS[file_format(filename=filename, content_type=content_type)]
    try:
        return reader(data, target)
    except ingest.IngestError as exc:
        raise InvalidInputError(str(exc)) from None


def parse_json(body: DataIn) -> ingest.ParsedDataset:
    """Arrays of a JSON dataset (already checked by its schema)."""
    try:
        return ingest.parse_arrays(body.X, body.y, body.feature_names)
    except ingest.IngestError as exc:
        raise InvalidInputError(str(exc)) from None


async def read_upload(
    request: Request, *, target: str | None, name: str | None
) -> tuple[ingest.ParsedDataset, str | None]:
    """Arrays and name of an upload: a JSON body, a multipart file or a raw CSV body.

    ``target`` and ``name`` are the query parameters (for raw CSV bodies); parsing runs in a
    worker thread so the event loop stays free.
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        body = await _read_json_dataset(request)
        return await run_in_threadpool(parse_json, body), body.name
    if content_type == "multipart/form-data":
        async with request.form() as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise InvalidInputError(
                    "multipart upload needs a file field 'file' (a .csv or .npz file)"
                )
            form_target, form_name = form.get("target"), form.get("name")
            content = await upload.read()
            filename, media_type = upload.filename, upload.content_type
        parsed = await run_in_threadpool(
            parse_file,
            content,
            filename=filename,
            content_type=media_type,
            target=form_target if isinstance(form_target, str) else None,
        )
        return parsed, form_name if isinstance(form_name, str) else None
    if content_type in ("text/csv", "application/csv"):
        content = await request.body()
        parsed = await run_in_threadpool(
            parse_file, content, filename=None, content_type="text/csv", target=target
        )
        return parsed, name
    raise UnsupportedMediaTypeError(
        f"Content-Type '{content_type or 'none'}' is not accepted; send application/json, "
        f"multipart/form-data with a file, or text/csv"
    )


async def _read_json_dataset(request: Request) -> DatasetIn:
    body = await request.body()
    if not body:
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        return DatasetIn.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from None


def store_dataset(
    session_factory: sessionmaker[Session], parsed: ingest.ParsedDataset, *, name: str | None
) -> DatasetOut:
    """Store ``parsed`` as a new dataset."""
    with session_scope(session_factory) as session:
        dataset = repository.create_dataset(
            session,
            X=parsed.X,
            y=parsed.y,
            feature_names=parsed.feature_names,
            target_name=parsed.target_name,
            name=name,
        )
        return dataset_out(dataset)
