"""Kept (extra) columns of an upload: read from CSV (both readers), Parquet, NPZ and JSON with
their inferred types, missing values kept, names checked, and their bytes counted by the
limits and the chunks."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from models_store import datasets as dataset_store
from service.checks import IngestError
from service.data import datasets, ingest, staging
from service.data.column_choice import ColumnChoice
from service.data.ingest import DatasetLimits, DatasetTooLargeError
from service.data.readers import csv as csv_reader
from service.data.readers import npz as npz_reader
from service.data.readers import parquet as parquet_reader

CSV = b"user,a,w,y,note\n u1 ,1,0.5,10,x\n7,2,,20,\nu3,3,nan,30,z\n"


def read_csv(data: bytes, **options) -> staging.StagedDataset:
    keep = options.pop("keep", ())
    return csv_reader.read_csv(
        io.BytesIO(data), target="y", choice=ColumnChoice(keep=tuple(keep), **options)
    )


def parsed(staged: staging.StagedDataset) -> ingest.ParsedDataset:
    with staged:
        return staged.to_parsed()


def assert_texts(values: np.ndarray, expected: list[str | None]) -> None:
    assert values.dtype == object
    assert values.tolist() == expected


def test_csv_keeps_columns_beside_the_features_with_inferred_types():
    with read_csv(CSV, keep=["user", "w", "note"]) as staged:
        assert staged.extra_columns == [
            {"name": "user", "type": "string"},  # '7' reads as a number, 'u1' does not
            {"name": "w", "type": "number"},
            {"name": "note", "type": "string"},
        ]
        result = staged.to_parsed()
    assert result.feature_names == ["a"]  # kept columns are left out of the features
    np.testing.assert_array_equal(result.X, [[1.0], [2.0], [3.0]])
    assert_texts(result.extra["user"], ["u1", "7", "u3"])  # trimmed
    np.testing.assert_array_equal(result.extra["w"], [0.5, np.nan, np.nan])
    assert_texts(result.extra["note"], ["x", None, "z"])  # an empty cell is missing


def test_the_exact_csv_reader_keeps_the_same_columns_as_the_fast_one(monkeypatch):
    fast = parsed(read_csv(CSV, keep=["user", "w", "note"]))

    def refuse(*args, **kwargs):
        raise csv_reader._FastPathRefusedError

    monkeypatch.setattr(csv_reader, "_stage_csv_fast", refuse)
    exact = parsed(read_csv(CSV, keep=["user", "w", "note"]))
    np.testing.assert_array_equal(exact.X, fast.X)
    for name in ("user", "note"):
        assert exact.extra[name].tolist() == fast.extra[name].tolist()
    np.testing.assert_array_equal(exact.extra["w"], fast.extra["w"])


def test_a_csv_column_turns_to_text_in_a_later_block(monkeypatch):
    monkeypatch.setattr(csv_reader, "CSV_BLOCK_BYTES", 64)
    rows = "".join(f"{i},{i}.5,{i}\n" for i in range(40))
    data = f"a,g,y\n{rows}9,id-x,1\n".encode()
    with read_csv(data, keep=["g"]) as staged:
        assert staged.extra_columns == [{"name": "g", "type": "string"}]
        result = staged.to_parsed()
    assert result.extra["g"].tolist() == [f"{i}.5" for i in range(40)] + ["id-x"]
    with read_csv(f"a,g,y\n{rows}".encode(), keep=["g"]) as staged:
        assert staged.extra_columns == [{"name": "g", "type": "number"}]
        np.testing.assert_array_equal(staged.to_parsed().extra["g"], np.arange(40) + 0.5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"keep": ["nope"]}, "keep names 'nope', but CSV has the columns user, a, w, y, note"),
        ({"keep": ["y"]}, "keep names the target column 'y'"),
        (
            {"keep": ["a"], "features": ("a",)},
            "keep and features both name the column 'a'; a kept column is never a feature",
        ),
        (
            {"keep": ["note"], "ignore": ("note",)},
            "keep and ignore both name the column 'note'; a kept column is never a feature",
        ),
        ({"keep": ["w", "w"]}, "keep names the column 'w' twice"),
    ],
)
def test_bad_keep_options_are_refused_naming_the_column(options, message):
    with pytest.raises(IngestError) as caught:
        read_csv(CSV, **options)
    assert str(caught.value) == message


def parquet_bytes(table: pa.Table) -> io.BytesIO:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    buffer.seek(0)
    return buffer


def test_parquet_keeps_text_numbers_and_dictionaries_with_their_missing_values():
    table = pa.table(
        {
            "a": [1.0, 2.0, 3.0],
            "id": pa.array([1, 2, None], pa.int64()),
            "user": pa.array(["7", None, "b"], pa.large_string()),
            "city": pa.array(["x", "y", "x"]).dictionary_encode(),
            "y": [1.0, 2.0, 3.0],
        }
    )
    staged = parquet_reader.read_parquet(
        parquet_bytes(table), target="y", choice=ColumnChoice(keep=("id", "user", "city"))
    )
    with staged:
        assert staged.extra_columns == [
            {"name": "id", "type": "number"},
            {"name": "user", "type": "string"},  # text stays text, digits or not
            {"name": "city", "type": "string"},
        ]
        result = staged.to_parsed()
    assert result.feature_names == ["a"]
    np.testing.assert_array_equal(result.extra["id"], [1.0, 2.0, np.nan])
    assert_texts(result.extra["user"], ["7", None, "b"])
    assert_texts(result.extra["city"], ["x", "y", "x"])


def test_parquet_refuses_to_keep_a_column_of_another_type():
    table = pa.table({"a": [1.0], "flag": [True], "y": [1.0]})
    with pytest.raises(IngestError, match="keep names the Parquet column 'flag', which holds bool"):
        parquet_reader.read_parquet(
            parquet_bytes(table), target="y", choice=ColumnChoice(keep=("flag",))
        )


def npz_bytes(**arrays) -> io.BytesIO:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    return buffer


def test_npz_keeps_named_arrays():
    source = npz_bytes(
        X=np.eye(3), y=np.arange(3.0), g=np.array(["a", "", "ccc"]), w=np.array([1, 2, 3])
    )
    with npz_reader.read_npz(source, keep=["g", "w"]) as staged:
        assert staged.extra_columns == [
            {"name": "g", "type": "string"},
            {"name": "w", "type": "number"},
        ]
        result = staged.to_parsed()
    assert_texts(result.extra["g"], ["a", None, "ccc"])
    np.testing.assert_array_equal(result.extra["w"], [1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    ("arrays", "keep", "message"),
    [
        (
            {"g": np.ones(3)},
            ["h"],
            "keep names 'h', but the NPZ's arrays besides X, y and feature_names are g",
        ),
        (
            {"g": np.ones(2)},
            ["g"],
            "NPZ array 'g' (kept) must be 1-D numbers or strings with one "
            "value per row (3), got shape (2,) of float64",
        ),
        ({}, ["X"], "keep names 'X', but the NPZ's arrays besides X, y and feature_names are none"),
    ],
)
def test_npz_refuses_a_kept_array_that_is_missing_or_of_the_wrong_shape(arrays, keep, message):
    with pytest.raises(IngestError) as caught:
        npz_reader.read_npz(npz_bytes(X=np.eye(3), y=np.ones(3), **arrays), keep=keep)
    assert str(caught.value) == message


def test_json_columns_are_numbers_or_text_with_null_as_missing():
    result = ingest.parse_arrays(
        [[1.0], [2.0]], [1.0, 2.0], None, {"w": [1.5, None], "user": ["a", None]}
    )
    np.testing.assert_array_equal(result.extra["w"], [1.5, np.nan])
    assert_texts(result.extra["user"], ["a", None])


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"w": [1.0, "a"]}, "columns['w'] mixes numbers and text; give all its values as one kind"),
        ({"w": [1.0]}, "columns['w'] has 1 values but X has 2 rows"),
        (
            {"x0": [1.0, 2.0]},
            "columns['x0'] has the name of a feature; an extra column is not a feature",
        ),
    ],
)
def test_json_columns_that_cannot_be_kept_are_refused(columns, message):
    with pytest.raises(IngestError) as caught:
        ingest.parse_arrays([[1.0], [2.0]], [1.0, 2.0], None, columns)
    assert str(caught.value) == message


def test_the_decoded_size_limit_counts_kept_bytes():
    rows = "".join(f"{i},{'é' * 10},{i}\n" for i in range(10))  # 20 UTF-8 bytes a text
    data = f"a,t,y\n{rows}".encode()
    plain = 10 * 2 * 8  # one feature and a target
    with read_csv(data, keep=["t"]) as staged:
        assert staged.n_rows == 10
    limits = DatasetLimits(max_decoded_bytes=plain + 10 * 20)
    with csv_reader.read_csv(
        io.BytesIO(data), target="y", limits=limits, choice=ColumnChoice(keep=("t",))
    ) as staged:
        assert staged.n_rows == 10
    too_small = DatasetLimits(max_decoded_bytes=plain + 10 * 20 - 1)
    with pytest.raises(DatasetTooLargeError, match=r"and 200 bytes of kept columns; at most 359"):
        csv_reader.read_csv(
            io.BytesIO(data), target="y", limits=too_small, choice=ColumnChoice(keep=("t",))
        )


def test_stored_chunks_are_bounded_by_the_bytes_of_kept_text(monkeypatch):
    monkeypatch.setattr(dataset_store, "DATASET_CHUNK_BYTES", 1_000)
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 200, 300)
    texts = np.array(["x" * int(length) for length in lengths], dtype=object)
    staged = staging.StagedDataset(
        feature_names=["a"], target_name="y", kept={"t": staging.STRING, "w": staging.NUMBER}
    )
    with staged:
        for start in range(0, 300, 70):  # blocks of another size than the chunks
            stop = min(start + 70, 300)
            staged.append(
                np.ones((stop - start, 1)),
                np.arange(start, stop, dtype=float),
                {"t": texts[start:stop], "w": np.arange(start, stop, dtype=float)},
            )
        chunks = list(datasets.stored_chunks(staged))
    row_bytes = 8 + 8 + lengths  # the feature, the number column, the text
    start = 0
    for _, y, extra in chunks:
        stop = start + len(y)
        assert row_bytes[start:stop].sum() <= 1_000
        if stop < 300:
            assert row_bytes[start : stop + 1].sum() > 1_000
        assert extra["t"].tolist() == texts[start:stop].tolist()
        np.testing.assert_array_equal(extra["w"], y)
        start = stop
    assert start == 300
