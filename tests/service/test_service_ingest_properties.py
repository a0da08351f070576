"""Property tests of the upload parsers (CSV, Parquet, NPZ, .npy pairs): whatever bytes arrive,
a parser returns checked rows or raises ``IngestError`` with a message; it never crashes,
never hangs (the test's timeout) and never lets a non-finite value through."""

from __future__ import annotations

import io
import warnings
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pa_parquet
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import checks
from service.data import ingest, staging
from service.data.readers import csv as csv_reader
from service.data.readers import npy as npy_reader
from service.data.readers import npz as npz_reader
from service.data.readers import parquet as parquet_reader

pytestmark = pytest.mark.timeout(240)

PROPERTY = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LIMITS = ingest.DatasetLimits(max_rows=50, max_features=8)


def outcome(read) -> staging.StagedDataset | checks.IngestError:
    """The staged rows a parser returns, or the ``IngestError`` it raises (anything else
    propagates and fails the test)."""
    try:
        staged = read()
    except checks.IngestError as exc:
        assert str(exc), "an error must say what is wrong"
        return exc
    with staged:
        assert 1 <= staged.n_rows <= LIMITS.max_rows
        assert 1 <= staged.n_features <= LIMITS.max_features
        assert len(set(staged.feature_names)) == staged.n_features
        for X, y in staged.blocks(7):
            assert np.isfinite(X).all() and np.isfinite(y).all()
    return staged


# --- CSV ---

cell = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr),
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(["", " ", "nan", "inf", "-Infinity", "1e400", "0x10", "1,5", '"3"', "abc"]),
    st.text(max_size=6),
)
name = st.one_of(st.sampled_from(["x", "y", "a", "b", "target"]), st.text(max_size=5))


@st.composite
def csv_documents(draw) -> tuple[bytes, str | None]:
    columns = draw(st.lists(name, min_size=0, max_size=6))
    rows = draw(
        st.lists(
            st.lists(cell, min_size=max(0, len(columns) - 1), max_size=len(columns) + 1),
            max_size=8,
        )
    )
    ending = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = ending.join([",".join(columns), *(",".join(row) for row in rows)])
    if draw(st.booleans()):
        text += ending
    target = draw(st.one_of(st.none(), st.sampled_from([*columns, "y", "missing"])))
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig", "latin-1"]))
    return text.encode(encoding, errors="replace"), target


@PROPERTY
@given(csv_documents())
def test_csv_of_any_shape_is_read_or_refused_with_a_message(document):
    data, target = document
    outcome(lambda: csv_reader.read_csv(io.BytesIO(data), target=target, limits=LIMITS))


@PROPERTY
@given(st.binary(max_size=400), st.sampled_from([None, "y", "a"]))
def test_csv_of_any_bytes_is_read_or_refused_with_a_message(data, target):
    outcome(lambda: csv_reader.read_csv(io.BytesIO(data), target=target, limits=LIMITS))


@PROPERTY
@given(
    st.lists(
        st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=3, max_size=3),
        min_size=1,
        max_size=20,
    )
)
def test_a_csv_of_numbers_is_read_exactly(rows):
    text = "a,b,y\n" + "".join(",".join(repr(value) for value in row) + "\n" for row in rows)
    with csv_reader.read_csv(io.BytesIO(text.encode()), target="y", limits=LIMITS) as staged:
        X, y = next(staged.blocks(100))
    expected = np.array(rows)
    np.testing.assert_array_equal(X, expected[:, :2])
    np.testing.assert_array_equal(y, expected[:, 2])


# --- NPZ ---


def filled(shape: tuple[int, ...], fill: object, dtype: str) -> np.ndarray:
    """An array of ``fill`` cast to ``dtype``, overflowing or not (that is the point)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.full(shape, fill).astype(dtype)


array = st.one_of(
    st.builds(
        filled,
        st.lists(st.integers(0, 5), max_size=3).map(tuple),
        st.one_of(
            st.floats(width=64),
            st.integers(-(2**31), 2**31 - 1),
            st.booleans(),
        ),
        st.sampled_from(["<f8", "<f4", ">f8", "<i4", "<i8", "|b1", "<c16", "<U3", "|S2"]),
    ),
    st.builds(lambda n: np.array([object()] * n, dtype=object), st.integers(0, 3)),
    st.builds(lambda values: np.array(values), st.lists(st.floats(), min_size=1, max_size=6)),
)


def npz_bytes(arrays: dict[str, np.ndarray], *, compressed: bool) -> bytes:
    buffer = io.BytesIO()
    save = np.savez_compressed if compressed else np.savez
    save(buffer, **arrays)
    return buffer.getvalue()


@PROPERTY
@given(
    st.dictionaries(st.sampled_from(["X", "y", "feature_names", "other"]), array, max_size=4),
    st.booleans(),
)
def test_npz_of_any_arrays_is_read_or_refused_with_a_message(arrays, compressed):
    data = npz_bytes(arrays, compressed=compressed)
    outcome(lambda: npz_reader.read_npz(io.BytesIO(data), limits=LIMITS))


VALID_NPZ = npz_bytes(
    {
        "X": np.arange(12.0).reshape(6, 2),
        "y": np.arange(6.0),
        "feature_names": np.array(["p", "q"]),
    },
    compressed=True,
)


@st.composite
def damaged(draw, original: bytes) -> bytes:
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 8))):
        position = draw(st.integers(0, len(data) - 1))
        data[position] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@PROPERTY
@given(damaged(VALID_NPZ))
def test_a_damaged_npz_is_read_or_refused_with_a_message(data):
    outcome(lambda: npz_reader.read_npz(io.BytesIO(data), limits=LIMITS))


@PROPERTY
@given(st.binary(max_size=300))
def test_npz_of_any_bytes_is_refused_with_a_message(data):
    result = outcome(lambda: npz_reader.read_npz(io.BytesIO(data), limits=LIMITS))
    assert isinstance(result, checks.IngestError)


def test_an_npz_whose_member_claims_a_huge_array_is_refused_before_allocating():
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (10**12, 10**6)}
    )
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("X.npy", header.getvalue())
        zipped.writestr("y.npy", header.getvalue())
    result = outcome(lambda: npz_reader.read_npz(io.BytesIO(archive.getvalue()), limits=LIMITS))
    assert isinstance(result, checks.IngestError)


# --- .npy pairs ---


def npy_bytes(values: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, values, allow_pickle=False)
    return buffer.getvalue()


VALID_X, VALID_Y = npy_bytes(np.arange(8.0).reshape(4, 2)), npy_bytes(np.arange(4.0))


@PROPERTY
@given(
    st.one_of(damaged(VALID_X), st.binary(max_size=200)),
    st.one_of(damaged(VALID_Y), st.just(VALID_Y)),
    st.one_of(st.none(), st.lists(name, max_size=3)),
)
def test_npy_pairs_of_any_bytes_are_read_or_refused_with_a_message(X_data, y_data, names):
    outcome(
        lambda: npy_reader.read_npy_pair(
            io.BytesIO(X_data), io.BytesIO(y_data), feature_names=names, limits=LIMITS
        )
    )


# --- Parquet ---

column = st.one_of(
    st.lists(st.floats(width=64), min_size=0, max_size=6).map(pa.array),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6).map(lambda v: pa.array(v, pa.int64())),
    st.lists(st.one_of(st.none(), st.floats(-10, 10)), max_size=6).map(pa.array),
    st.lists(st.text(max_size=3), max_size=6).map(pa.array),
    st.lists(st.booleans(), max_size=6).map(pa.array),
)


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pa_parquet.write_table(table, buffer, row_group_size=3)
    return buffer.getvalue()


@st.composite
def parquet_tables(draw) -> bytes:
    names = draw(st.lists(name, min_size=1, max_size=5, unique=True))
    columns = [draw(column) for _ in names]
    length = min(len(values) for values in columns)
    table = pa.table([values.slice(0, length) for values in columns], names=names)
    return parquet_bytes(table)


@PROPERTY
@given(parquet_tables(), st.sampled_from([None, "y", "x", "target"]))
def test_parquet_of_any_columns_is_read_or_refused_with_a_message(data, target):
    outcome(lambda: parquet_reader.read_parquet(io.BytesIO(data), target=target, limits=LIMITS))


VALID_PARQUET = parquet_bytes(
    pa.table({"a": [0.5, 1.5, 2.5, 3.5], "b": [1, 2, 3, 4], "y": [1.0, -1.0, 2.0, 0.0]})
)


@PROPERTY
@given(st.one_of(damaged(VALID_PARQUET), st.binary(max_size=300)))
def test_a_damaged_parquet_file_is_read_or_refused_with_a_message(data):
    outcome(lambda: parquet_reader.read_parquet(io.BytesIO(data), target="y", limits=LIMITS))


def test_the_limits_are_errors_of_the_documented_kind():
    rows = "".join(f"{index},{index}\n" for index in range(LIMITS.max_rows + 1))
    result = outcome(
        lambda: csv_reader.read_csv(io.BytesIO(f"a,y\n{rows}".encode()), target="y", limits=LIMITS)
    )
    assert isinstance(result, ingest.DatasetTooLargeError)
    assert "MIXREG_MAX_ROWS" in str(result)
