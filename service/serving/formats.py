"""The encodings of predict bodies: JSON, and NumPy ``.npy`` / ``.npz`` for binary batches.

A binary batch is one ``.npy`` array (``Content-Type: application/x-npy``): an (n, d) matrix of
numbers in, an (n, k) float64 matrix out when the request's ``Accept`` prefers
``application/x-npy``. A keyed model's batch is an ``.npz`` archive
(``Content-Type: application/x-npz``) of the rows ``X`` and their ``keys`` (integers or
text). Arrays are read with ``allow_pickle=False`` semantics: only numeric (and, for keys,
text) dtypes are accepted, so a body can never make the server unpickle anything.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from service.data import ingest

FloatArray = NDArray[np.float64]

JSON_MEDIA_TYPE = "application/json"
NPY_MEDIA_TYPE = "application/x-npy"
NPZ_MEDIA_TYPE = "application/x-npz"

MAX_KEY_LENGTH = 256
"""Characters a text key may have (as in a JSON body)."""

# What reading a damaged archive or member may raise.
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError)


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


def read_npz_keyed(body: bytes, *, max_decoded_bytes: int) -> tuple[FloatArray, list[str | int]]:
    """The rows ``X`` and their ``keys`` held by the ``.npz`` bytes ``body``: exactly the
    arrays ``X`` (n, d) of finite numbers and ``keys`` (n,) of integers or text.

    Raises ``IngestError`` naming what is wrong (not a zip archive, a missing or extra array,
    a bad dtype or shape, an empty, too long or NUL-holding text key, a key out of 64 bits),
    and ``DatasetTooLargeError`` for an array that decompresses to more than
    ``max_decoded_bytes`` (checked on the declared size, before it is decompressed).
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
    except _ARCHIVE_ERRORS as exc:
        raise ingest.IngestError(f"the .npz body is not a readable zip archive: {exc}") from None
    with archive:
        members = {name.removesuffix(".npy"): name for name in archive.namelist()}
        if set(members) != {"X", "keys"}:
            raise ingest.IngestError(
                "the .npz body must hold exactly the arrays X and keys; it holds "
                f"{', '.join(sorted(members)) or 'none'}"
            )
        raw = {}
        for name, member in members.items():
            size = archive.getinfo(member).file_size
            if size > max_decoded_bytes:
                raise ingest.DatasetTooLargeError(
                    f"the .npz array {name} takes {size:,} bytes; at most "
                    f"{max_decoded_bytes:,} are accepted (MIXREG_MAX_DECODED_BYTES)"
                )
            try:
                raw[name] = archive.read(member)
            except _ARCHIVE_ERRORS as exc:
                raise ingest.IngestError(f"the .npz array {name} cannot be read: {exc}") from None
    X = read_npy_matrix(raw["X"], name="the .npz array X")
    return X, _keys_of_npy(raw["keys"], n_rows=X.shape[0])


def _keys_of_npy(data: bytes, *, n_rows: int) -> list[str | int]:
    try:
        keys = np.load(io.BytesIO(data), allow_pickle=False)
    except _ARCHIVE_ERRORS as exc:
        raise ingest.IngestError(
            f"the .npz array keys is not a .npy array of integers or text: {exc}"
        ) from None
    if keys.shape != (n_rows,) or keys.dtype.kind not in "iuU":
        raise ingest.IngestError(
            f"the .npz array keys must be 1-D integers or text with one key per row of X "
            f"({n_rows:,}), got shape {keys.shape} of {keys.dtype}"
        )
    if keys.dtype.kind == "u" and keys.size and int(keys.max()) >= 2**63:
        at = int(np.argmax(keys >= 2**63))
        raise ingest.IngestError(f"keys[{at}] is beyond a 64-bit signed integer")
    if keys.dtype.kind in "iu":
        integers: list[str | int] = keys.astype(np.int64).tolist()
        return integers
    lengths = np.char.str_len(keys)
    # A text shorter than the dtype's width is padded with NUL code points; one within the
    # text's length is a NUL of its own.
    codes = keys.view(np.uint32).reshape(keys.size, -1)
    within = np.arange(codes.shape[1]) < lengths[:, None]
    holds_nul = ((codes == 0) & within).any(axis=1)
    bad = (lengths == 0) | (lengths > MAX_KEY_LENGTH) | holds_nul
    if bad.any():
        at = int(np.argmax(bad))
        raise ingest.IngestError(
            f"keys[{at}] must be a text of 1 to {MAX_KEY_LENGTH} characters without NUL"
        )
    texts: list[str | int] = keys.tolist()
    return texts


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
