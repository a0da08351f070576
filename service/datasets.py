"""Storing uploaded datasets: pick the reader by file type, store the arrays in one unit of work."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath

from sqlalchemy.orm import Session, sessionmaker

from models_store import repository
from models_store.session import session_scope
from service import ingest
from service.errors import InvalidInputError, UnsupportedMediaTypeError
from service.schemas import DataIn, DatasetOut
from service.views import dataset_out

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
