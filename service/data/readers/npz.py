"""The NPZ reader: an ``.npz`` archive of ``X``, ``y`` and optional ``feature_names`` and kept
arrays, each member's ``.npy`` header checked before its data is read; never pickle."""

from __future__ import annotations

import io
import math
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager

import numpy as np
from numpy.typing import NDArray

from service.checks import IngestError, resolve_feature_names
from service.data.ingest import NO_LIMITS, BinaryFile, DatasetLimits, ParsedDataset
from service.data.readers.npy import (
    NPY_MAGIC,
    ZIP_ERRORS,
    NpyHeader,
    check_available,
    check_npy_pair,
    checked_npy_header,
    parse_npy_header,
    stage_npy_pair,
)
from service.data.staging import StagedDataset

FloatArray = NDArray[np.float64]

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
MAX_NPZ_NAMES_BYTES = 64 * 1024 * 1024
"""The array ``feature_names`` of an NPZ archive may hold at most this many bytes."""
_COPY_BLOCK_BYTES = 1 << 20


def read_npz(
    source: BinaryFile, *, limits: DatasetLimits = NO_LIMITS, keep: Sequence[str] = ()
) -> StagedDataset:
    """Read an ``.npz`` archive with a 2-D array ``X``, a 1-D array ``y`` and optional
    string array ``feature_names``; object arrays are refused (no pickle). The 1-D arrays
    named in ``keep`` (numbers or strings, one value per row) are kept as extra columns.

    The headers of ``X`` and ``y`` are checked (shape, dtype, the size limits) before any of
    their data is read; each is then decompressed to a temporary file and read in blocks of
    rows like a ``.npy`` file, so the memory needed is one block whatever the array's size.
    """
    start = source.read(len(NPY_MAGIC))
    source.seek(0)
    if start.startswith(NPY_MAGIC):
        raise IngestError(
            "file is a single .npy array; upload an .npz archive with arrays X and y, or X and "
            "y as two .npy files (form fields 'X' and 'y')"
        )
    if not start.startswith(_ZIP_MAGIC):
        raise IngestError("file is not a readable NPZ archive: it is not a zip file")
    try:
        archive = zipfile.ZipFile(source)
    except ZIP_ERRORS as exc:
        raise IngestError(f"file is not a readable NPZ archive: {exc}") from None
    with archive:
        members = {name.removesuffix(".npy"): name for name in archive.namelist()}
        listed = ", ".join(members) or "none"
        for required in ("X", "y"):
            if required not in members:
                raise IngestError(f"NPZ has no array '{required}'; arrays are {listed}")
        X_header = _npz_member_header(archive, members["X"], name="NPZ array 'X'", ndim=2)
        y_header = _npz_member_header(archive, members["y"], name="NPZ array 'y'", ndim=1)
        _, n_features = check_npy_pair(X_header, y_header, limits=limits)
        raw_names: list[str] | None = None
        if "feature_names" in members:
            raw_names = _npz_feature_names(archive, members["feature_names"], n_features)
        names = resolve_feature_names(raw_names, n_features)
        kept = _npz_kept_headers(
            archive,
            members,
            keep,
            n_rows=X_header.shape[0],
            n_features=n_features,
            limits=limits,
        )
        with ExitStack() as files:
            X_file = files.enter_context(
                _extracted(archive, members["X"], X_header, name="NPZ array 'X'")
            )
            y_file = files.enter_context(
                _extracted(archive, members["y"], y_header, name="NPZ array 'y'")
            )
            kept_files = {
                name: (
                    files.enter_context(
                        _extracted(archive, members[name], header, name=f"NPZ array '{name}'")
                    ),
                    header,
                )
                for name, header in kept.items()
            }
            return stage_npy_pair(X_file, y_file, X_header, y_header, names, limits, kept_files)


def parse_npz(data: bytes) -> ParsedDataset:
    """Read an ``.npz`` archive held in memory (see ``read_npz``)."""
    with read_npz(io.BytesIO(data)) as staged:
        return staged.to_parsed()


def _npz_member_header(archive: zipfile.ZipFile, member: str, *, name: str, ndim: int) -> NpyHeader:
    """The header of the ``.npy`` member ``member``, checked as ``read_npy_header`` does, its
    data bytes against the member's size; no data is read."""
    try:
        size = archive.getinfo(member).file_size
        with archive.open(member) as stream:
            if stream.read(len(NPY_MAGIC)) != NPY_MAGIC:
                raise IngestError(f"NPZ member '{member}' is not a .npy array")
        with archive.open(member) as stream:
            header = checked_npy_header(stream, name=name, ndim=ndim)
    except IngestError:
        raise
    except ZIP_ERRORS as exc:
        raise IngestError(f"{name} cannot be read: {exc}") from None
    check_available(header, size - header.data_offset, name=name)
    return header


def _npz_kept_headers(
    archive: zipfile.ZipFile,
    members: Mapping[str, str],
    keep: Sequence[str],
    *,
    n_rows: int,
    n_features: int,
    limits: DatasetLimits,
) -> dict[str, NpyHeader]:
    """The headers of the arrays named in ``keep``: each 1-D, ``n_rows`` long, of numbers or
    strings no wider than the text limit, all of them with the rows within the byte limit
    (a string array counts its declared width: numpy pads every value to it); no data is
    read."""
    kept: dict[str, NpyHeader] = {}
    for name in keep:
        if name in ("X", "y", "feature_names") or name not in members:
            raise IngestError(
                f"keep names '{name}', but the NPZ's arrays besides X, y and feature_names are "
                f"{', '.join(sorted(set(members) - {'X', 'y', 'feature_names'})) or 'none'}"
            )
        if name in kept:
            raise IngestError(f"keep names the array '{name}' twice")
        label = f"NPZ array '{name}'"
        try:
            size = archive.getinfo(members[name]).file_size
            with archive.open(members[name]) as stream:
                shape, fortran_order, dtype = parse_npy_header(stream, name=label)
                header = NpyHeader(tuple(shape), bool(fortran_order), dtype, stream.tell())
        except IngestError:
            raise
        except ZIP_ERRORS as exc:
            raise IngestError(f"{label} cannot be read: {exc}") from None
        if len(shape) != 1 or shape[0] != n_rows or dtype.kind not in "biufU":
            raise IngestError(
                f"{label} (kept) must be 1-D numbers or strings with one value per row "
                f"({n_rows:,}), got shape {shape} of {dtype}"
            )
        if dtype.kind == "U":
            # numpy pads every value to the array's width (that of its longest text).
            limits.check_text_width(dtype.itemsize // 4, column=name)
        check_available(header, size - header.data_offset, name=label)
        kept[name] = header
    limits.check_rows(n_rows, n_features, sum(header.data_bytes for header in kept.values()))
    return kept


def _npz_feature_names(archive: zipfile.ZipFile, member: str, n_features: int) -> list[str]:
    name = "NPZ array 'feature_names'"
    try:
        with archive.open(member) as stream:
            shape, fortran_order, dtype = parse_npy_header(stream, name=name)
            if len(shape) != 1 or dtype.kind != "U":
                raise IngestError(f"{name} must be a 1-D array of strings")
            declared = math.prod(shape) * dtype.itemsize
            if shape[0] != n_features or declared > MAX_NPZ_NAMES_BYTES:
                raise IngestError(
                    f"feature_names has {shape[0]} names of up to {dtype.itemsize // 4:,} "
                    f"characters but X has {n_features} columns"
                    if shape[0] != n_features
                    else f"{name} declares {declared:,} bytes; at most "
                    f"{MAX_NPZ_NAMES_BYTES:,} are read"
                )
            data = stream.read(declared)
    except IngestError:
        raise
    except ZIP_ERRORS as exc:
        raise IngestError(f"{name} cannot be read: {exc}") from None
    if len(data) < declared:
        raise IngestError(f"{name} declares {declared:,} bytes but holds only {len(data):,}")
    values = np.frombuffer(data, dtype=dtype)
    del fortran_order  # a 1-D array reads the same in either order
    return [str(item) for item in values.tolist()]


@contextmanager
def _extracted(
    archive: zipfile.ZipFile, member: str, header: NpyHeader, *, name: str
) -> Iterator[BinaryFile]:
    """The member ``member`` of ``archive`` copied to a temporary file (deleted on exit), at
    most as many bytes as its header declares."""
    with tempfile.TemporaryFile(prefix="mixreg-upload-npz-") as copy:
        try:
            with archive.open(member) as stream:
                remaining = header.data_offset + header.data_bytes
                while remaining > 0:
                    block = stream.read(min(_COPY_BLOCK_BYTES, remaining))
                    if not block:
                        break
                    copy.write(block)
                    remaining -= len(block)
                # Reading on to the member's end checks its CRC-32.
                stream.read(1)
        except ZIP_ERRORS as exc:
            raise IngestError(f"{name} cannot be read: {exc}") from None
        copy.seek(0)
        yield copy
