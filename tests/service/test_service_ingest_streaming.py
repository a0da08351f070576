"""Uploads read in blocks: CSV (pyarrow, with the csv module naming errors), Parquet, .npy
pairs and limits; every format reads the same numbers bit for bit, every bad file is named."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.checks import IngestError
from service.data import column_choice, ingest, staging
from service.data.ingest import DatasetLimits, DatasetTooLargeError
from service.data.readers import csv as csv_reader
from service.data.readers import npy as npy_reader
from service.data.readers import npz as npz_reader
from service.data.readers import parquet as parquet_reader


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.uint64)


def awkward_data(n_rows: int = 3000, n_features: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    X = rng.standard_normal((n_rows, n_features)) * 10.0 ** rng.integers(-100, 100, (n_rows, 1))
    X[0, :3] = [-0.0, 5e-324, 1 / 3][:n_features]
    y = rng.standard_normal(n_rows)
    return X, y


def csv_bytes(X: np.ndarray, y: np.ndarray, *, line_end: str = "\n") -> bytes:
    header = ",".join([f"x{j}" for j in range(X.shape[1])] + ["y"])
    lines = [header] + [
        ",".join(repr(float(v)) for v in [*row, target]) for row, target in zip(X, y, strict=True)
    ]
    return (line_end.join(lines) + line_end).encode()


def parquet_bytes(table: pa.Table, **options) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    return buffer.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def staged_arrays(staged: staging.StagedDataset) -> tuple[np.ndarray, np.ndarray]:
    with staged:
        parsed = staged.to_parsed()
    return parsed.X, parsed.y


@pytest.fixture
def small_blocks(monkeypatch):
    """Parse in blocks of a few hundred bytes, so a small file spans many blocks."""
    monkeypatch.setattr(csv_reader, "CSV_BLOCK_BYTES", 512)
    monkeypatch.setattr(csv_reader, "_TEXT_BLOCK_BYTES", 7)
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 800)


@pytest.mark.parametrize("line_end", ["\n", "\r\n", "\r"])
def test_csv_in_many_blocks_reads_every_value_bit_exact(small_blocks, line_end):
    X, y = awkward_data()
    staged = csv_reader.read_csv(io.BytesIO(csv_bytes(X, y, line_end=line_end)), target="y")
    assert (staged.feature_names, staged.target_name) == (["x0", "x1", "x2"], "y")
    X_read, y_read = staged_arrays(staged)
    np.testing.assert_array_equal(bits(X_read), bits(X))
    np.testing.assert_array_equal(bits(y_read), bits(y))


def test_csv_rows_the_fast_reader_refuses_are_read_by_the_csv_module(small_blocks):
    # Blank-looking lines, a quoted value and Python's number syntax: the exact reader
    # accepts what the csv module and float() accept.
    content = b'a, y\n1_000,2\n   \n,\n"3.5",4\n'
    X, y = staged_arrays(csv_reader.read_csv(io.BytesIO(content), target="y"))
    np.testing.assert_array_equal(X, [[1000.0], [3.5]])
    np.testing.assert_array_equal(y, [2.0, 4.0])


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (
            b"x,4\n",
            "CSV line 2002, column 'a': 'x' is not a number; to leave out a column of ids or "
            "text, upload with ignore=a, or keep it beside the features with keep=a",
        ),
        (b"1,nan\n", "CSV line 2002, column 'y' is NaN; all values must be finite numbers"),
        (b"1\n", "CSV line 2002 has 1 field, expected 2"),
        (
            b"1,\n",
            "CSV line 2002, column 'y' is empty; all values must be finite numbers (na=drop "
            "leaves out the rows with an empty cell)",
        ),
        (b"1,2\n\xff\n", "CSV is not UTF-8 text (byte 8008 is invalid)"),
    ],
)
def test_a_bad_value_deep_in_a_csv_is_named_by_its_line(small_blocks, tail, message):
    content = b"a,y\n" + b"1,2\n" * 2000 + tail
    with pytest.raises(IngestError) as error:
        csv_reader.read_csv(io.BytesIO(content), target="y")
    assert str(error.value) == message


def test_parquet_of_integers_and_floats_in_several_row_groups():
    X, y = awkward_data(n_rows=1000)
    single = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    table = pa.table(
        {
            "count": pa.array(np.arange(1000), pa.int32()),
            "x0": X[:, 0],
            "target": y,
            "x1": pa.array(single),
        }
    )
    staged = parquet_reader.read_parquet(
        io.BytesIO(parquet_bytes(table, row_group_size=64)), target="target"
    )
    assert (staged.feature_names, staged.target_name) == (["count", "x0", "x1"], "target")
    X_read, y_read = staged_arrays(staged)
    np.testing.assert_array_equal(X_read[:, 0], np.arange(1000))
    np.testing.assert_array_equal(bits(X_read[:, 1]), bits(X[:, 0]))
    np.testing.assert_array_equal(X_read[:, 2], single)
    np.testing.assert_array_equal(bits(y_read), bits(y))


GOOD_PARQUET = parquet_bytes(pa.table({"a": [1.0, 2.0, 3.0], "y": [0.5, 1.5, 2.5]}))


@pytest.mark.parametrize(
    ("content", "target", "message"),
    [
        (GOOD_PARQUET[:-20], "y", "file is not a readable Parquet file: Parquet magic bytes not"),
        (b"PAR1 and nothing else", "y", "file is not a readable Parquet file"),
        (GOOD_PARQUET, "z", "Parquet file has no column 'z'; columns are a, y"),
        (GOOD_PARQUET, None, "name the column to predict"),
        (
            parquet_bytes(pa.table({"a": ["1", "2"], "y": [1.0, 2.0]})),
            "y",
            "Parquet column 'a' holds string, not numbers; the features and the target must "
            "hold integers or",
        ),
        (
            parquet_bytes(pa.table({"a": [1.0, None, 3.0], "y": [1.0, 2.0, 3.0]})),
            "y",
            "Parquet row 2, column 'a' is missing (null); all values must be finite numbers",
        ),
        (
            parquet_bytes(pa.table({"a": [1.0, 2.0], "y": [1.0, float("inf")]})),
            "y",
            "Parquet row 2, column 'y' is infinite; all values must be finite numbers",
        ),
        (parquet_bytes(pa.table({"y": [1.0]})), "y", "Parquet file has only the target column"),
        (
            parquet_bytes(
                pa.table({"a": pa.array([], pa.float64()), "y": pa.array([], pa.float64())})
            ),
            "y",
            "Parquet file has no rows",
        ),
    ],
)
def test_bad_parquet(content, target, message):
    with pytest.raises(IngestError) as error:
        parquet_reader.read_parquet(io.BytesIO(content), target=target)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("layout", ["C", "F", "big-endian", "int32"])
def test_npy_pairs_in_any_layout_read_bit_exact(small_blocks, layout):
    X, y = awkward_data(n_rows=500, n_features=4)
    stored = {
        "C": X,
        "F": np.asfortranarray(X),
        "big-endian": X.astype(">f8"),
        "int32": np.arange(2000, dtype=np.int32).reshape(500, 4),
    }[layout]
    staged = npy_reader.read_npy_pair(
        io.BytesIO(npy_bytes(stored)), io.BytesIO(npy_bytes(y)), feature_names=["a", "b", "c", "d"]
    )
    assert staged.feature_names == ["a", "b", "c", "d"]
    X_read, y_read = staged_arrays(staged)
    np.testing.assert_array_equal(bits(X_read), bits(stored.astype(np.float64)))
    np.testing.assert_array_equal(bits(y_read), bits(y))


@pytest.mark.parametrize(
    ("X_file", "y_file", "message"),
    [
        (b"not numpy", npy_bytes(np.ones(2)), "X.npy is not a .npy file"),
        (npy_bytes(np.ones((2, 2)))[:-5], npy_bytes(np.ones(2)), "X.npy declares shape (2, 2) of"),
        (
            npy_bytes(np.array([[1, "a"]], dtype=object)),
            npy_bytes(np.ones(1)),
            "X.npy must hold numbers, got dtype object",
        ),
        (npy_bytes(np.ones((2, 2, 2))), npy_bytes(np.ones(2)), "X.npy must be 2-dimensional"),
        (npy_bytes(np.ones((2, 2))), npy_bytes(np.ones((2, 1))), "y.npy must be 1-dimensional"),
        (npy_bytes(np.ones((3, 2))), npy_bytes(np.ones(2)), "y has 2 values but X has 3 rows"),
        (
            npy_bytes(np.array([[1.0, np.nan]])),
            npy_bytes(np.ones(1)),
            "X[0][1] is NaN; all values must be finite numbers",
        ),
        (npy_bytes(np.ones((2, 2)) > 0), npy_bytes(np.ones(2)), None),
    ],
)
def test_bad_npy_pairs(X_file, y_file, message):
    if message is None:  # booleans are numbers to numpy: accepted as 0 and 1
        X, _ = staged_arrays(
            npy_reader.read_npy_pair(io.BytesIO(X_file), io.BytesIO(y_file), feature_names=None)
        )
        np.testing.assert_array_equal(X, np.ones((2, 2)))
        return
    with pytest.raises(IngestError) as error:
        npy_reader.read_npy_pair(io.BytesIO(X_file), io.BytesIO(y_file), feature_names=None)
    assert str(error.value).startswith(message)


def test_limits_stop_an_upload_and_name_the_setting(small_blocks):
    content = b"a,b,y\n" + b"1,2,3\n" * 2000
    limits = DatasetLimits(max_rows=1999)
    with pytest.raises(DatasetTooLargeError) as error:
        csv_reader.read_csv(io.BytesIO(content), target="y", limits=limits)
    assert str(error.value) == (
        "the dataset has more than 1,999 rows; at most 1,999 are accepted (MIXREG_MAX_ROWS)"
    )
    with pytest.raises(DatasetTooLargeError) as error:
        csv_reader.read_csv(io.BytesIO(content), target="y", limits=DatasetLimits(max_features=1))
    assert str(error.value) == (
        "the dataset has 2 features; at most 1 are accepted (MIXREG_MAX_FEATURES)"
    )
    parquet = parquet_bytes(pa.table({"a": np.ones(50), "y": np.ones(50)}))
    with pytest.raises(DatasetTooLargeError, match="MIXREG_MAX_ROWS"):
        parquet_reader.read_parquet(
            io.BytesIO(parquet), target="y", limits=DatasetLimits(max_rows=49)
        )
    X_file, y_file = npy_bytes(np.ones((50, 3))), npy_bytes(np.ones(50))
    with pytest.raises(DatasetTooLargeError, match="MIXREG_MAX_ROWS"):
        npy_reader.read_npy_pair(
            io.BytesIO(X_file), io.BytesIO(y_file), feature_names=None, limits=DatasetLimits(10)
        )


def test_staged_rows_read_back_in_blocks_of_any_size():
    X, y = awkward_data(n_rows=103)
    with staging.StagedDataset(feature_names=["a", "b", "c"], target_name="y") as staged:
        for start in range(0, 103, 10):
            staged.append(X[start : start + 10], y[start : start + 10])
        assert staged.n_rows == 103
        blocks = list(staged.blocks(25))
    assert [len(block_y) for _, block_y in blocks] == [25, 25, 25, 25, 3]
    np.testing.assert_array_equal(bits(np.vstack([block for block, _ in blocks])), bits(X))
    np.testing.assert_array_equal(bits(np.concatenate([block for _, block in blocks])), bits(y))


def test_a_staged_block_is_checked_with_its_rows_counted_over_the_upload():
    with staging.StagedDataset(feature_names=["a"], target_name=None) as staged:
        staged.append(np.ones((5, 1)), np.ones(5))
        with pytest.raises(IngestError, match=r"^X row 6 is too large"):
            staged.append(np.array([[0.0], [1e200]]), np.ones(2))
        with pytest.raises(IngestError, match=r"^y\[5\] is NaN"):
            staged.append(np.ones((1, 1)), np.array([np.nan]))


class BusyMachineFile(io.BufferedRandom):
    """A file whose reads from any thread but the main one are slow, as on a busy machine:
    pyarrow's read-ahead thread is then still reading when its reader has given up."""

    def read(self, size: int | None = -1) -> bytes:
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.02)
        return super().read(size)


def test_a_csv_is_read_the_same_way_every_time_while_pyarrow_still_reads_ahead(
    tmp_path, monkeypatch
):
    # pyarrow refuses the block with 'x'; the exact reader must then read the file from its
    # first byte to that line, whatever pyarrow's thread still reads from the same file.
    monkeypatch.setattr(csv_reader, "CSV_BLOCK_BYTES", 4096)
    monkeypatch.setattr(csv_reader, "_TEXT_BLOCK_BYTES", 1024)
    path = tmp_path / "upload.csv"
    path.write_bytes(b"a,y\n" + b"1,2\n" * 8000 + b"1,x\n" + b"1,2\n" * 40_000)
    messages = []
    for _ in range(3):
        with BusyMachineFile(io.FileIO(path, "r+")) as source, pytest.raises(IngestError) as error:
            csv_reader.read_csv(source, target="y")
        messages.append(str(error.value))
    assert messages == ["CSV line 8002, column 'y': 'x' is not a number"] * 3


def test_a_line_of_millions_of_fields_is_counted_without_splitting_it():
    content = b"a,y\n" + b"1," * 2_000_000 + b"1\n"
    with pytest.raises(IngestError) as error:
        csv_reader.read_csv(io.BytesIO(content), target="y")
    assert str(error.value) == "CSV line 2 has 2000001 fields, expected 2"


def test_a_wide_header_is_refused_by_the_feature_limit_at_once():
    names = [f"column_{index}" for index in range(300_000)]  # a 4 MB header
    content = (",".join([*names, "y"]) + "\n1,2\n").encode()
    assert len(content) > 4_000_000
    started = time.perf_counter()
    with pytest.raises(DatasetTooLargeError) as error:
        csv_reader.read_csv(
            io.BytesIO(content), target="y", limits=DatasetLimits(max_features=1000)
        )
    assert time.perf_counter() - started < 5
    assert str(error.value) == (
        "the dataset has 300,000 features; at most 1,000 are accepted (MIXREG_MAX_FEATURES)"
    )


def test_a_header_of_repeated_names_is_checked_in_linear_time():
    # Below the feature limit the names are still checked in one pass (the list was searched
    # once per column before: 38 s for 76,000 columns).
    names = [f"column_{index}" for index in range(200_000)] + ["column_7"]
    content = (",".join([*names, "y"]) + "\n").encode()
    started = time.perf_counter()
    with pytest.raises(IngestError) as error:
        csv_reader.read_csv(io.BytesIO(content), target="y")
    assert time.perf_counter() - started < 5
    assert str(error.value).startswith("CSV header repeats the column 'column_7'; columns are ")
    assert str(error.value).endswith("(199,982 more)")


def test_every_format_is_bounded_by_its_decoded_bytes(small_blocks):
    limits = DatasetLimits(max_decoded_bytes=8 * 3 * 99)  # 99 rows of two features and y
    message = (
        "the dataset's 100 rows of 2 features and a target take 2,400 bytes as float64; at most "
        "2,376 are accepted (MIXREG_MAX_DECODED_BYTES)"
    )
    X, y = np.ones((100, 2), dtype=np.int8), np.ones(100, dtype=np.int8)
    with pytest.raises(DatasetTooLargeError) as error:
        npy_reader.read_npy_pair(
            io.BytesIO(npy_bytes(X)), io.BytesIO(npy_bytes(y)), feature_names=None, limits=limits
        )
    assert str(error.value) == message
    archive = io.BytesIO()
    np.savez_compressed(archive, X=X, y=y)
    with pytest.raises(DatasetTooLargeError) as error:
        npz_reader.read_npz(io.BytesIO(archive.getvalue()), limits=limits)
    assert str(error.value) == message
    parquet = parquet_bytes(pa.table({"a": X[:, 0], "b": X[:, 1], "y": y}))
    with pytest.raises(DatasetTooLargeError) as error:
        parquet_reader.read_parquet(io.BytesIO(parquet), target="y", limits=limits)
    assert str(error.value) == message  # from the footer, before any row is decoded
    with pytest.raises(DatasetTooLargeError, match="MIXREG_MAX_DECODED_BYTES"):
        csv_reader.read_csv(io.BytesIO(b"a,b,y\n" + b"1,1,1\n" * 100), target="y", limits=limits)
    staged = csv_reader.read_csv(
        io.BytesIO(b"a,b,y\n" + b"1,1,1\n" * 99), target="y", limits=limits
    )
    with staged:
        assert staged.n_rows == 99


def test_an_npz_member_is_refused_by_its_header_before_its_data_is_read():
    # 10 million rows declared, compressed to a few kilobytes: refused before decompressing.
    archive = io.BytesIO()
    np.savez_compressed(archive, X=np.zeros((10_000_000, 2), np.int8), y=np.zeros(10_000_000))
    limits = DatasetLimits(max_rows=1_000_000)
    started = time.perf_counter()
    with pytest.raises(DatasetTooLargeError, match="MIXREG_MAX_ROWS"):
        npz_reader.read_npz(io.BytesIO(archive.getvalue()), limits=limits)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("archive_of", [np.savez, np.savez_compressed])
def test_npz_arrays_in_either_order_read_bit_exact(small_blocks, archive_of):
    X, y = awkward_data(n_rows=500, n_features=4)
    archive = io.BytesIO()
    archive_of(archive, X=np.asfortranarray(X), y=y, feature_names=np.array(list("abcd")))
    X_read, y_read = staged_arrays(npz_reader.read_npz(io.BytesIO(archive.getvalue())))
    np.testing.assert_array_equal(bits(X_read), bits(X))
    np.testing.assert_array_equal(bits(y_read), bits(y))


PEAK_OF_A_FORTRAN_NPY = """
import resource, sys, tempfile
import numpy as np
from service.data.readers import npy as npy_reader
X = np.asfortranarray(np.ones((1_000_000, 20), dtype=np.int8))  # 20 MB
y = np.ones(1_000_000, dtype=np.int8)
with tempfile.TemporaryFile() as X_file, tempfile.TemporaryFile() as y_file:
    np.save(X_file, X)
    np.save(y_file, y)
    del X
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with npy_reader.read_npy_pair(X_file, y_file, feature_names=None) as staged:
        assert staged.n_rows == 1_000_000
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024)
"""


def test_a_fortran_order_npy_is_read_in_blocks_of_rows():
    # Measured in a process of its own: the peak resident memory only grows.
    result = subprocess.run(
        [sys.executable, "-c", PEAK_OF_A_FORTRAN_NPY],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    added = int(result.stdout)
    assert added < 64 * 2**20, f"reading added {added / 2**20:.0f} MiB to the peak"


@pytest.mark.parametrize(
    "first_row",
    [b"1,2,3,u1\n", b"1_000,2,3,u1\n"],  # the second is read by the csv module, not pyarrow
    ids=["arrow", "csv-module"],
)
def test_na_drop_leaves_out_rows_with_an_empty_feature_or_target(small_blocks, first_row):
    gaps = b",5,6,u2\n7,,,u3\n\n" + b"8,9,10,\n" * 300 + b"11,12,,u4\n"
    content = b"a,b,y,id\n" + first_row + gaps
    with pytest.raises(IngestError) as error:
        csv_reader.read_csv(
            io.BytesIO(content), target="y", choice=column_choice.ColumnChoice(keep=("id",))
        )
    assert str(error.value).startswith("CSV line 3, column 'a' is empty;")
    assert "na=drop" in str(error.value)

    staged = csv_reader.read_csv(
        io.BytesIO(content), target="y", choice=column_choice.ColumnChoice(keep=("id",)), na="drop"
    )
    # A gap in a kept column keeps its row; the blank line is skipped as ever, not counted.
    assert staged.dropped_rows == {"a": 1, "b": 1, "y": 2}
    X, y = staged_arrays(staged)
    assert X.shape == (301, 2)
    np.testing.assert_array_equal(X[0], [1000.0 if b"_" in first_row else 1.0, 2.0])
    np.testing.assert_array_equal(y[1:], np.full(300, 10.0))


def test_na_takes_error_or_drop():
    with pytest.raises(IngestError, match="na must be one of error, drop, got 'skip'"):
        csv_reader.read_csv(io.BytesIO(b"a,y\n1,2\n"), target="y", na="skip")
