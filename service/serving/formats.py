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
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from service import checks
from service.data import ingest
from service.data.readers.npy import NpyHeader, read_npy_header, read_npz_member_header

FloatArray = NDArray[np.float64]

JSON_MEDIA_TYPE = "application/json"
NPY_MEDIA_TYPE = "application/x-npy"
NPZ_MEDIA_TYPE = "application/x-npz"

MAX_KEY_LENGTH = 256
"""Characters a text key may have (as in a JSON body)."""

# What reading a damaged archive or member may raise.
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError)


ShapeCheck = Callable[[int, int, str], None]
"""Called with a body's rows, features and name (``the .npz array X``) once its header is
read, before its data are converted or decompressed: raises when they are beyond a limit."""


def read_npy_matrix(
    body: bytes, *, name: str = "the .npy body", check_shape: ShapeCheck | None = None
) -> FloatArray:
    """The finite float64 matrix held by the ``.npy`` bytes ``body``.

    Raises ``IngestError`` naming what is wrong: not a ``.npy`` array, not numbers, not 2-D,
    truncated, no rows or columns, or an entry that is NaN or infinite (``X[i][j]``).
    ``check_shape`` sees the declared shape before the data are converted.
    """
    source = io.BytesIO(body)
    header = read_npy_header(source, name=name, ndim=2)
    _check_matrix_shape(header, name=name, check_shape=check_shape)
    return _finite_matrix(body, header)


def _check_matrix_shape(header: NpyHeader, *, name: str, check_shape: ShapeCheck | None) -> None:
    n_rows, n_features = header.shape
    if n_rows == 0:
        raise checks.IngestError("X is empty; at least one row is required")
    if n_features == 0:
        raise checks.IngestError("X row 0 has no values; at least one feature is required")
    if check_shape is not None:
        check_shape(n_rows, n_features, name)


def _finite_matrix(data: bytes | bytearray, header: NpyHeader) -> FloatArray:
    """The (n, d) matrix the ``.npy`` ``data`` (header included) holds, as finite float64."""
    n_rows, n_features = header.shape
    values = np.frombuffer(
        data, dtype=header.dtype, count=n_rows * n_features, offset=header.data_offset
    )
    shape = (n_rows, n_features)
    matrix = values.reshape(shape, order="F") if header.fortran_order else values.reshape(shape)
    X = np.ascontiguousarray(matrix, dtype=np.float64)
    checks.check_finite_matrix(X)
    return X


DECOMPRESS_BLOCK_BYTES = 1 << 20
"""An ``.npz`` member is decompressed this many bytes at a time, into an array of the size its
header declares (checked first): a member cannot decompress to more."""


def read_npz_keyed(
    body: bytes,
    *,
    max_decoded_bytes: int,
    decoded_setting: str,
    check_shape: ShapeCheck | None = None,
) -> tuple[FloatArray, list[str | int]]:
    """The rows ``X`` and their ``keys`` held by the ``.npz`` bytes ``body``: exactly the
    arrays ``X`` (n, d) of finite numbers and ``keys`` (n,) of integers or text.

    The members' ``.npy`` headers are read first: their shapes and dtypes are checked, the
    shape of ``X`` by ``check_shape``, and what the arrays take once decompressed (``X`` as
    float64, and the keys) against ``max_decoded_bytes`` (the setting ``decoded_setting``),
    all before any data is decompressed. A small archive of zeros can declare gigabytes.

    Raises ``IngestError`` naming what is wrong (not a zip archive, a missing or extra array,
    a bad dtype or shape, data shorter or longer than declared, an empty, too long or
    NUL-holding text key, a key out of 64 bits), and ``DatasetTooLargeError`` naming the
    arrays, their sizes and the setting when they would take more than ``max_decoded_bytes``.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
    except _ARCHIVE_ERRORS as exc:
        raise checks.IngestError(f"the .npz body is not a readable zip archive: {exc}") from None
    with archive:
        members = {name.removesuffix(".npy"): name for name in archive.namelist()}
        if set(members) != {"X", "keys"}:
            raise checks.IngestError(
                "the .npz body must hold exactly the arrays X and keys; it holds "
                f"{', '.join(sorted(members)) or 'none'}"
            )
        X_name, keys_name = "the .npz array X", "the .npz array keys"
        X_header = read_npz_member_header(archive, members["X"], name=X_name)
        if X_header.dtype.kind not in "biuf" or len(X_header.shape) != 2:
            raise checks.IngestError(
                f"{X_name} must be a 2-D array of numbers, got shape {X_header.shape} of "
                f"{X_header.dtype}"
            )
        keys_header = read_npz_member_header(archive, members["keys"], name=keys_name)
        _check_matrix_shape(X_header, name=X_name, check_shape=check_shape)
        _check_decoded(X_header, keys_header, max_decoded_bytes, decoded_setting)
        n_rows = X_header.shape[0]
        if keys_header.shape != (n_rows,) or keys_header.dtype.kind not in "iuU":
            raise checks.IngestError(
                f"the .npz array keys must be 1-D integers or text with one key per row of X "
                f"({n_rows:,}), got shape {keys_header.shape} of {keys_header.dtype}"
            )
        X_data = _decompressed(archive, members["X"], X_header, name=X_name)
        keys_data = _decompressed(archive, members["keys"], keys_header, name=keys_name)
    X = _finite_matrix(X_data, X_header)
    del X_data
    keys = np.frombuffer(keys_data, dtype=keys_header.dtype, offset=keys_header.data_offset)
    return X, _checked_keys(keys)


def _check_decoded(
    X_header: NpyHeader,
    keys_header: NpyHeader,
    max_decoded_bytes: int,
    decoded_setting: str,
) -> None:
    """Raise ``DatasetTooLargeError`` if ``X`` as float64 and the keys take more bytes than
    allowed, naming each array's shape and bytes."""
    n_rows, n_features = X_header.shape
    X_bytes = n_rows * n_features * np.dtype(np.float64).itemsize
    keys_bytes = keys_header.data_bytes
    keys_shape = " x ".join(f"{size:,}" for size in keys_header.shape)
    if X_bytes + keys_bytes > max_decoded_bytes:
        raise ingest.DatasetTooLargeError(
            f"the .npz arrays take {X_bytes + keys_bytes:,} bytes decompressed (X "
            f"{n_rows:,} x {n_features:,} as float64: {X_bytes:,}; keys {keys_shape} of "
            f"{keys_header.dtype}: {keys_bytes:,}); at most {max_decoded_bytes:,} are "
            f"accepted ({decoded_setting}); send fewer rows per request"
        )


def _decompressed(
    archive: zipfile.ZipFile, member: str, header: NpyHeader, *, name: str
) -> bytearray:
    """The member's bytes, header and data, decompressed in blocks into a buffer of the size
    its header declares; ``IngestError`` if the member holds fewer or more bytes."""
    size = header.data_offset + header.data_bytes
    data = bytearray(size)
    view = memoryview(data)
    try:
        with archive.open(member) as stream:
            filled = 0
            while filled < size:
                block = stream.read(min(DECOMPRESS_BLOCK_BYTES, size - filled))
                if not block:
                    raise checks.IngestError(
                        f"{name} declares {header.data_bytes:,} bytes of data but holds only "
                        f"{filled - header.data_offset:,}"
                    )
                view[filled : filled + len(block)] = block
                filled += len(block)
            # Reading on to the member's end checks its CRC-32.
            if stream.read(1):
                declared = header.data_bytes
                raise checks.IngestError(
                    f"{name} holds more than the {declared:,} bytes of data its header declares"
                )
    except checks.IngestError:
        raise
    except _ARCHIVE_ERRORS as exc:
        raise checks.IngestError(f"{name} cannot be read: {exc}") from None
    finally:
        view.release()
    return data


def _checked_keys(keys: NDArray[Any]) -> list[str | int]:
    """The keys of the rows as Python values, each checked."""
    if keys.dtype.kind == "u" and keys.size and int(keys.max()) >= 2**63:
        at = int(np.argmax(keys >= 2**63))
        raise checks.IngestError(f"keys[{at}] is beyond a 64-bit signed integer")
    if keys.dtype.kind in "iu":
        integers: list[str | int] = keys.astype(np.int64).tolist()
        return integers
    if keys.dtype.itemsize == 0:  # every key is empty text
        raise checks.IngestError(
            f"keys[0] must be a text of 1 to {MAX_KEY_LENGTH} characters without NUL"
        )
    lengths = np.char.str_len(keys)
    # A text shorter than the dtype's width is padded with NUL code points; one within the
    # text's length is a NUL of its own.
    codes = keys.view(np.uint32).reshape(keys.size, -1)
    within = np.arange(codes.shape[1]) < lengths[:, None]
    holds_nul = ((codes == 0) & within).any(axis=1)
    bad = (lengths == 0) | (lengths > MAX_KEY_LENGTH) | holds_nul
    if bad.any():
        at = int(np.argmax(bad))
        raise checks.IngestError(
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
