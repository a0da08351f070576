"""The encodings of predict bodies: JSON, and NumPy ``.npy`` for binary batches.

A binary batch is one ``.npy`` array (``Content-Type: application/x-npy``): an (n, d) matrix of
numbers in, an (n, k) float64 matrix out when the request's ``Accept`` prefers
``application/x-npy``. Arrays are read with ``allow_pickle=False`` semantics: only numeric
dtypes are accepted, so a body can never make the server unpickle anything.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from service.data import ingest

FloatArray = NDArray[np.float64]

JSON_MEDIA_TYPE = "application/json"
NPY_MEDIA_TYPE = "application/x-npy"


def read_npy_matrix(body: bytes, *, name: str = "the .npy body") -> FloatArray:
    """The finite float64 matrix held by the ``.npy`` bytes ``body``.

    Raises ``IngestError`` naming what is wrong: not a ``.npy`` array, not numbers, not 2-D,
    truncated, no rows or columns, or an entry that is NaN or infinite (``X[i][j]``).
    """
    source = io.BytesIO(body)
    header = ingest.read_npy_header(source, name=name, ndim=2)
    n_rows, n_features = header.shape
    if n_rows == 0:
        raise ingest.IngestError("X is empty; at least one row is required")
    if n_features == 0:
        raise ingest.IngestError("X row 0 has no values; at least one feature is required")
    data = np.frombuffer(
        body, dtype=header.dtype, count=n_rows * n_features, offset=header.data_offset
    )
    shape = (n_rows, n_features)
    matrix = data.reshape(shape, order="F") if header.fortran_order else data.reshape(shape)
    X = np.ascontiguousarray(matrix, dtype=np.float64)
    ingest.check_finite_matrix(X)
    return X


def npy_bytes(array: NDArray[Any]) -> bytes:
    """``array`` as the bytes of a ``.npy`` file."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def json_bytes(payload: dict[str, Any]) -> bytes:
    """``payload`` (numbers, lists and numpy arrays) as compact JSON; floats are written as the
    shortest text that reads back to the same double."""
    contiguous = {
        key: np.ascontiguousarray(value) if isinstance(value, np.ndarray) else value
        for key, value in payload.items()
    }
    return orjson.dumps(contiguous, option=orjson.OPT_SERIALIZE_NUMPY)


def _media_ranges(accept: str) -> list[tuple[str, float]]:
    ranges = []
    for item in accept.split(","):
        media_type, *parameters = (part.strip() for part in item.split(";"))
        quality = 1.0
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if media_type:
            ranges.append((media_type.lower(), quality))
    return ranges


def prefers_npy(accept: str | None) -> bool:
    """True if the ``Accept`` header ranks ``application/x-npy`` above JSON (JSON wins ties,
    wildcards and an absent header)."""
    if not accept or NPY_MEDIA_TYPE not in accept.lower():
        return False
    npy_quality = json_quality = 0.0
    for media_type, quality in _media_ranges(accept):
        if media_type == NPY_MEDIA_TYPE:
            npy_quality = max(npy_quality, quality)
        elif media_type in (JSON_MEDIA_TYPE, "application/*", "*/*"):
            json_quality = max(json_quality, quality)
    return npy_quality > json_quality
