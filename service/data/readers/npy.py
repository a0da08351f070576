"""``.npy`` headers and the reader of a pair of ``.npy`` files (``X`` and ``y``).

A header is parsed without numpy's loader (no pickle, its size and dtype checked first);
the members of an NPZ archive (:mod:`service.data.readers.npz`) are ``.npy`` files too.
"""

from __future__ import annotations

import ast
import math
import os
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.checks import IngestError, resolve_feature_names
from service.data import ingest
from service.data.ingest import NO_LIMITS, BinaryFile, DatasetLimits
from service.data.staging import NUMBER, STRING, StagedDataset, staged_dataset

FloatArray = NDArray[np.float64]

NPY_MAGIC = b"\x93NUMPY"
# What reading a damaged zip member may raise besides IngestError.
ZIP_ERRORS = (
    ValueError,
    OSError,
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
)


@dataclass(frozen=True)
class NpyHeader:
    """What the header of a ``.npy`` file declares, and where its data starts."""

    shape: tuple[int, ...]
    fortran_order: bool
    dtype: np.dtype[Any]
    data_offset: int

    @property
    def data_bytes(self) -> int:
        """Bytes of data the header declares."""
        return math.prod(self.shape) * self.dtype.itemsize


NPY_MAX_HEADER_BYTES = 10_000
"""The longest ``.npy`` header read (numpy's own default limit)."""

_NPY_VERSIONS = {(1, 0): (2, "latin1"), (2, 0): (4, "latin1"), (3, 0): (4, "utf-8")}


def parse_npy_header(source: BinaryFile, *, name: str) -> tuple[tuple[int, ...], bool, Any]:
    """The shape, Fortran order and dtype a ``.npy`` header at the stream's position declares.

    The header is parsed here rather than by numpy, whose reader falls back to a Python 2
    parser (with a warning) and lets tokenizer errors escape on damaged bytes: any header that
    is not exactly a dict of ``descr``, ``fortran_order`` and ``shape`` is refused.
    """
    unreadable = f"{name} has an unreadable .npy header"
    prefix = source.read(len(NPY_MAGIC) + 2)
    if len(prefix) < len(NPY_MAGIC) + 2 or not prefix.startswith(NPY_MAGIC):
        raise IngestError(f"{name} is not a .npy file (it does not start with \\x93NUMPY)")
    version = (prefix[-2], prefix[-1])
    if version not in _NPY_VERSIONS:
        raise IngestError(
            f"{name} is a .npy file of version {version[0]}.{version[1]}; versions 1.0, 2.0 "
            f"and 3.0 are read"
        )
    length_bytes, encoding = _NPY_VERSIONS[version]
    length = int.from_bytes(source.read(length_bytes), "little")
    if length > NPY_MAX_HEADER_BYTES:
        raise IngestError(f"{unreadable}: it declares {length:,} bytes")
    raw = source.read(length)
    if len(raw) < length:
        raise IngestError(f"{unreadable}: the file ends inside it")
    try:
        header = ast.literal_eval(raw.decode(encoding))
    except Exception:  # any text that is not a Python literal, whatever the parser raises
        raise IngestError(f"{unreadable}: it is not a dictionary literal") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise IngestError(f"{unreadable}: it must give exactly descr, fortran_order and shape")
    shape, fortran_order = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in shape
    ):
        raise IngestError(f"{unreadable}: its shape {shape!r} is not a tuple of sizes")
    if not isinstance(fortran_order, bool):
        raise IngestError(f"{unreadable}: fortran_order must be True or False")
    try:
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    except Exception:  # numpy raises several types for a descr it cannot read
        raise IngestError(f"{unreadable}: it declares no dtype numpy knows") from None
    return shape, fortran_order, dtype


def read_npy_header(source: BinaryFile, *, name: str, ndim: int) -> NpyHeader:
    """Read and check the header of a ``.npy`` file of numbers with ``ndim`` dimensions.

    Raises ``IngestError`` naming the file (``name``) when it is not a ``.npy`` file, holds
    something other than numbers (object arrays are never unpickled), has another number of
    dimensions, or holds fewer bytes than its shape needs (a truncated file).
    """
    source.seek(0)
    header = checked_npy_header(source, name=name, ndim=ndim)
    check_available(header, source.seek(0, os.SEEK_END) - header.data_offset, name=name)
    source.seek(header.data_offset)
    return header


def read_npz_member_header(archive: zipfile.ZipFile, member: str, *, name: str) -> NpyHeader:
    """What the ``.npy`` header of the archive's ``member`` declares, of any dtype (the caller
    checks it), its data bytes checked against the size the archive declares for the member.

    Only the header is decompressed: a member's data may be asked for once its shape is known
    to be within the limits. Raises ``IngestError`` naming the member (``name``).
    """
    try:
        size = archive.getinfo(member).file_size
        with archive.open(member) as stream:
            shape, fortran_order, dtype = parse_npy_header(stream, name=name)
            data_offset = stream.tell()
    except IngestError:
        raise
    except ZIP_ERRORS as exc:
        raise IngestError(f"{name} cannot be read: {exc}") from None
    header = NpyHeader(tuple(shape), bool(fortran_order), dtype, data_offset)
    check_available(header, size - data_offset, name=name)
    return header


def checked_npy_header(source: BinaryFile, *, name: str, ndim: int) -> NpyHeader:
    """The header at the stream's position, of numbers with ``ndim`` dimensions."""
    start = source.tell()
    shape, fortran_order, dtype = parse_npy_header(source, name=name)
    header = NpyHeader(tuple(shape), bool(fortran_order), dtype, source.tell() - start)
    if dtype.kind not in "biuf" or dtype.hasobject:
        raise IngestError(f"{name} must hold numbers, got dtype {dtype}")
    if len(header.shape) != ndim:
        raise IngestError(f"{name} must be {ndim}-dimensional, got shape {header.shape}")
    return header


def check_available(header: NpyHeader, available: int, *, name: str) -> None:
    if header.data_bytes > available:
        raise IngestError(
            f"{name} declares shape {header.shape} of {header.dtype} ({header.data_bytes:,} "
            f"bytes) but holds only {available:,} bytes"
        )


def _npy_rows(source: BinaryFile, header: NpyHeader, rows: int) -> Iterator[NDArray[Any]]:
    """The rows of a 2-D ``.npy`` matrix, ``rows`` at a time.

    In Fortran order each column is stored whole, one after the other: a block of rows is then
    gathered from every column's stretch of the file, so memory stays one block either way.
    """
    n_rows, n_columns = header.shape
    itemsize = header.dtype.itemsize
    source.seek(header.data_offset)
    for start in range(0, n_rows, rows):
        count = min(rows, n_rows - start)
        if not header.fortran_order:
            block = source.read(count * n_columns * itemsize)
            yield np.frombuffer(block, dtype=header.dtype).reshape(count, n_columns)
            continue
        gathered = np.empty((count, n_columns), dtype=header.dtype)
        for column in range(n_columns):
            source.seek(header.data_offset + (column * n_rows + start) * itemsize)
            gathered[:, column] = np.frombuffer(source.read(count * itemsize), header.dtype)
        yield gathered


def check_npy_pair(
    X_header: NpyHeader, y_header: NpyHeader, *, limits: DatasetLimits
) -> tuple[int, int]:
    """The rows and features of a matrix ``X`` and vector ``y``, checked against each other
    and the limits before any data is read."""
    n_rows, n_features = X_header.shape
    if n_rows == 0:
        raise IngestError("X is empty; at least one row is required")
    if n_features == 0:
        raise IngestError("X row 0 has no values; at least one feature is required")
    if y_header.shape[0] != n_rows:
        raise IngestError(f"y has {y_header.shape[0]} values but X has {n_rows} rows")
    limits.check_features(n_features)
    limits.check_rows(n_rows, n_features)
    return n_rows, n_features


def stage_npy_pair(
    X_source: BinaryFile,
    y_source: BinaryFile,
    X_header: NpyHeader,
    y_header: NpyHeader,
    feature_names: list[str],
    limits: DatasetLimits,
    kept: Mapping[str, tuple[BinaryFile, NpyHeader]] | None = None,
) -> StagedDataset:
    """Stage ``X`` and ``y`` block by block, with the kept 1-D arrays (each a file and its
    header) read block by block beside them."""
    kept = kept or {}
    types = {
        name: STRING if header.dtype.kind == "U" else NUMBER for name, (_, header) in kept.items()
    }
    staged = staged_dataset(feature_names, None, limits, types)
    try:
        y_source.seek(y_header.data_offset)
        for kept_source, kept_header in kept.values():
            kept_source.seek(kept_header.data_offset)
        row_bytes = 8 * (len(feature_names) + 1) + sum(
            header.dtype.itemsize for _, header in kept.values()
        )
        for X_block in _npy_rows(X_source, X_header, max(1, ingest.BLOCK_BYTES // row_bytes)):
            count = X_block.shape[0]
            y_block = np.frombuffer(y_source.read(count * y_header.dtype.itemsize), y_header.dtype)
            staged.append(
                np.asarray(X_block, np.float64),
                np.asarray(y_block, np.float64),
                {
                    name: npz_kept_values(
                        np.frombuffer(
                            kept_source.read(count * kept_header.dtype.itemsize), kept_header.dtype
                        )
                    )
                    for name, (kept_source, kept_header) in kept.items()
                },
            )
    except BaseException:
        staged.close()
        raise
    return staged


def read_npy_pair(
    X_source: BinaryFile,
    y_source: BinaryFile,
    *,
    feature_names: Sequence[str] | None,
    limits: DatasetLimits = NO_LIMITS,
) -> StagedDataset:
    """Read a 2-D ``.npy`` matrix ``X`` and a 1-D ``.npy`` vector ``y`` of the same length,
    the matrix in blocks of rows (in either memory order)."""
    X_header = read_npy_header(X_source, name="X.npy", ndim=2)
    y_header = read_npy_header(y_source, name="y.npy", ndim=1)
    _, n_features = check_npy_pair(X_header, y_header, limits=limits)
    names = resolve_feature_names(feature_names, n_features)
    return stage_npy_pair(X_source, y_source, X_header, y_header, names, limits)


def npz_kept_values(values: NDArray[Any]) -> NDArray[Any]:
    """A block of a kept NPZ array: float64 numbers, or ``str`` (``None`` for an empty
    string, a missing value as in a CSV)."""
    if values.dtype.kind != "U":
        return values.astype(np.float64)
    texts = values.astype(object)
    texts[values == ""] = None
    return texts
