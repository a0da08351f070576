"""Arrays to stored bytes and JSON numbers and back; never pickle.

Matrices and vectors are stored as raw little-endian float64 bytes in C order; the shape is kept
in separate columns and checked against the byte length on decode. A dataset chunk's extra
columns (numbers and text) are stored as one Arrow IPC stream
(docs/adr/0018-extra-columns-as-arrow-ipc-per-chunk.md).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

_FLOAT64_LE = np.dtype("<f8")


def encode_matrix(a: npt.ArrayLike) -> bytes:
    """Encode a 2-D array as little-endian float64 bytes in C order."""
    array = np.asarray(a, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got an array with shape {array.shape}")
    return np.ascontiguousarray(array, dtype=_FLOAT64_LE).tobytes()


def decode_matrix(b: bytes, rows: int, cols: int) -> npt.NDArray[np.float64]:
    """Decode ``rows * cols`` float64 values written by :func:`encode_matrix`."""
    if rows < 0 or cols < 0:
        raise ValueError(f"matrix shape must be non-negative, got ({rows}, {cols})")
    _check_length(b, rows * cols, f"a ({rows}, {cols}) float64 matrix")
    return np.frombuffer(b, dtype=_FLOAT64_LE).astype(np.float64).reshape(rows, cols)


def encode_vector(a: npt.ArrayLike) -> bytes:
    """Encode a 1-D array as little-endian float64 bytes."""
    array = np.asarray(a, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got an array with shape {array.shape}")
    return np.ascontiguousarray(array, dtype=_FLOAT64_LE).tobytes()


def decode_vector(b: bytes, length: int) -> npt.NDArray[np.float64]:
    """Decode ``length`` float64 values written by :func:`encode_vector`."""
    if length < 0:
        raise ValueError(f"vector length must be non-negative, got {length}")
    _check_length(b, length, f"a float64 vector of length {length}")
    return np.frombuffer(b, dtype=_FLOAT64_LE).astype(np.float64)


NUMBER = "number"
STRING = "string"
COLUMN_TYPES = (NUMBER, STRING)
"""The types of a dataset's extra columns: float64 numbers (NaN when missing), or text."""


def encode_columns(columns: Mapping[str, npt.ArrayLike], types: Mapping[str, str]) -> bytes:
    """Encode equally long 1-D columns as one Arrow IPC stream of one record batch.

    ``types`` gives each column's type: a ``number`` column is stored as float64 (a missing
    value as NaN), a ``string`` column as UTF-8 text (``None`` as a missing value).
    """
    import pyarrow as pa

    arrays = []
    for name, values in columns.items():
        if types[name] == NUMBER:
            arrays.append(pa.array(np.asarray(values, dtype=np.float64), type=pa.float64()))
        elif types[name] == STRING:
            arrays.append(pa.array(np.asarray(values, dtype=object), type=pa.string()))
        else:
            raise ValueError(f"column '{name}' has the unknown type {types[name]!r}")
    batch = pa.RecordBatch.from_arrays(arrays, names=list(columns))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue())


def decode_columns(
    b: bytes, n_rows: int, names: Sequence[str], types: Mapping[str, str]
) -> dict[str, npt.NDArray[Any]]:
    """Decode the columns ``names`` of a stream written by :func:`encode_columns`: float64 for
    a ``number`` column, an object array of ``str`` (``None`` where missing) for a ``string``
    one. Raises ``ValueError`` if a column is absent or not ``n_rows`` long."""
    import pyarrow as pa

    table = pa.ipc.open_stream(pa.BufferReader(b)).read_all()
    if table.num_rows != n_rows:
        raise ValueError(f"extra columns need {n_rows} rows, got {table.num_rows}")
    decoded: dict[str, npt.NDArray[Any]] = {}
    for name in names:
        if name not in table.column_names:
            raise ValueError(f"the stored extra columns have no column '{name}'")
        column = table.column(name)
        if types[name] == NUMBER:
            decoded[name] = column.to_numpy().astype(np.float64, copy=False)
        else:
            decoded[name] = np.asarray(column.to_numpy(zero_copy_only=False), dtype=object)
    return decoded


def _check_length(b: bytes, n_values: int, what: str) -> None:
    expected = n_values * _FLOAT64_LE.itemsize
    if len(b) != expected:
        raise ValueError(f"{what} needs {expected} bytes, got {len(b)}")


def to_json_value(value: Any) -> Any:
    """Convert numpy arrays and scalars inside ``value`` to plain JSON-ready Python values.

    Python floats keep every bit through JSON (their repr is the shortest string that reads
    back to the same double). Non-finite floats are refused: JSON has no NaN or infinity.
    """
    if isinstance(value, np.ndarray):
        return to_json_value(value.tolist())
    if isinstance(value, np.generic):
        return to_json_value(value.item())
    if isinstance(value, float):
        if not np.isfinite(value):
            raise ValueError(f"cannot store the non-finite number {value!r}")
        return value
    if isinstance(value, Mapping):
        return {str(key): to_json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(item) for item in value]
    return value


class GroupTable(NamedTuple):
    """A grouped model's training groups, the line of each and, for EM, each one's posterior."""

    labels: npt.NDArray[Any]
    lines: npt.NDArray[np.intp]
    posteriors: npt.NDArray[np.float64] | None
    """Shape (n_groups, n_components); None for a fit without posteriors (not EM) and for
    tables stored before posteriors were kept."""


def encode_group_table(
    labels: npt.ArrayLike, lines: npt.ArrayLike, posteriors: npt.ArrayLike | None = None
) -> bytes:
    """A grouped model's group -> line table as one compressed ``.npz`` (no pickle).

    ``labels`` are the sorted distinct group labels, strings (stored as fixed-width unicode)
    or numbers (float64); ``lines`` the line of each, stored as int16 (k is far below 2^15);
    ``posteriors`` (EM only) each group's posterior over the lines, shape (n_groups, k),
    stored as float32 (a probability needs no more digits than that).
    Repetitive labels such as ``user-123`` compress to a few bytes each.
    """
    label_array = np.asarray(labels)
    if label_array.dtype.kind in "OSU":
        label_array = label_array.astype(str)
    else:
        label_array = label_array.astype(np.float64)
    line_array = np.asarray(lines, dtype=np.int16)
    if label_array.shape != line_array.shape or label_array.ndim != 1:
        raise ValueError(
            f"group labels {label_array.shape} and lines {line_array.shape} must be two "
            f"vectors of one length"
        )
    # Any: savez_compressed's keyword arrays are typed as its own flags.
    arrays: dict[str, Any] = {"labels": label_array, "lines": line_array}
    if posteriors is not None:
        posterior_array = np.asarray(posteriors, dtype=np.float32)
        if posterior_array.ndim != 2 or posterior_array.shape[0] != label_array.size:
            raise ValueError(
                f"group posteriors {posterior_array.shape} must have one row per group "
                f"({label_array.size})"
            )
        arrays["posteriors"] = posterior_array
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def decode_group_table(b: bytes) -> GroupTable:
    """The table written by :func:`encode_group_table` (posteriors None when it has none)."""
    stored = decode_arrays(b)
    labels, lines = stored["labels"], stored["lines"].astype(np.intp)
    posteriors = stored["posteriors"].astype(np.float64) if "posteriors" in stored else None
    if labels.shape != lines.shape:
        raise ValueError("a stored group table's labels and lines differ in length")
    if posteriors is not None and posteriors.shape[0] != labels.size:
        raise ValueError("a stored group table's posteriors and labels differ in length")
    return GroupTable(labels, lines, posteriors)


TEXT_BYTES_SUFFIX = ".utf8"
TEXT_OFFSETS_SUFFIX = ".offsets"
"""A text array ``name`` is stored as two arrays: ``name.utf8``, every value's UTF-8 bytes one
after the other, and ``name.offsets``, where each value starts and the last ends (int64)."""


def encode_arrays(arrays: Mapping[str, npt.ArrayLike]) -> bytes:
    """Encode named arrays of numbers or text as one ``.npz`` archive (no pickle).

    A text array (fixed-width, or an object array of ``str``) is stored compactly as its UTF-8
    bytes and their offsets (:data:`TEXT_BYTES_SUFFIX`), never at the width of its longest
    value: one long key among thousands must not multiply their size. Any other object array
    is refused.
    """
    buffer = io.BytesIO()
    plain: dict[str, npt.NDArray[Any]] = {}
    for name, values in arrays.items():
        array = np.asarray(values)
        if array.dtype.kind in "OU":
            plain.update(_text_arrays(name, array))
        else:
            plain[name] = array
    np.savez(buffer, allow_pickle=False, **plain)
    return buffer.getvalue()


def _text_arrays(name: str, array: npt.NDArray[Any]) -> dict[str, npt.NDArray[Any]]:
    """The 1-D text array ``array`` as its UTF-8 bytes and their offsets."""
    import pyarrow as pa

    if array.ndim != 1:
        raise ValueError(f"array '{name}' of text must be 1-D, got shape {array.shape}")
    try:
        texts = pa.array(array, type=pa.large_string(), from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise ValueError(f"array '{name}' holds Python objects; store numbers or text") from None
    if texts.null_count:
        raise ValueError(
            f"array '{name}' holds Python objects that are not text (None); store numbers or text"
        )
    _, offsets_buffer, data_buffer = texts.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype="<i8")[: len(texts) + 1]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)[: int(offsets[-1])]
        if data_buffer is not None
        else np.zeros(0, dtype=np.uint8)
    )
    return {name + TEXT_BYTES_SUFFIX: data, name + TEXT_OFFSETS_SUFFIX: offsets}


def decode_arrays(b: bytes) -> dict[str, npt.NDArray[Any]]:
    """Decode the arrays :func:`encode_arrays` wrote (never unpickling anything): a text array
    as an object array of ``str``; a fixed-width one, as stored before texts were stored
    compactly, as it was stored."""
    with np.load(io.BytesIO(b), allow_pickle=False) as archive:
        stored = {name: archive[name] for name in archive.files}
    decoded: dict[str, npt.NDArray[Any]] = {}
    for name, array in stored.items():
        if name.endswith(TEXT_OFFSETS_SUFFIX):
            continue
        if name.endswith(TEXT_BYTES_SUFFIX):
            base = name.removesuffix(TEXT_BYTES_SUFFIX)
            offsets = stored.get(base + TEXT_OFFSETS_SUFFIX)
            if offsets is None:
                raise ValueError(f"stored text '{base}' has bytes but no offsets")
            decoded[base] = _decode_text(base, array, offsets)
        else:
            decoded[name] = array
    return decoded


def _decode_text(
    name: str, data: npt.NDArray[Any], offsets: npt.NDArray[Any]
) -> npt.NDArray[np.object_]:
    import pyarrow as pa

    if data.dtype != np.uint8 or offsets.dtype.kind not in "iu" or offsets.ndim != 1:
        raise ValueError(
            f"stored text '{name}' has bytes of {data.dtype}, offsets of {offsets.dtype}"
        )
    n_values = offsets.size - 1
    if n_values < 0:
        raise ValueError(f"stored text '{name}' has no offsets")
    texts = pa.LargeStringArray.from_buffers(
        n_values,
        pa.py_buffer(np.ascontiguousarray(offsets, dtype="<i8")),
        pa.py_buffer(np.ascontiguousarray(data)),
    )
    try:
        # Offsets within the bytes, increasing, and every value valid UTF-8.
        texts.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise ValueError(f"stored text '{name}' is damaged: {exc}") from None
    return np.asarray(texts.to_numpy(zero_copy_only=False), dtype=object)
