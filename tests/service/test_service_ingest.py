"""Reading uploads: CSV, JSON rows and NPZ, with an exact message for every bad input."""

from __future__ import annotations

import io

import numpy as np
import pytest

from service.checks import IngestError
from service.data import ingest
from service.data.readers import csv as csv_reader
from service.data.readers import npz as npz_reader


def npz_bytes(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_csv_with_a_named_target_column():
    parsed = csv_reader.parse_csv(b"a,target,b\n1,10,2\n3.5,-1e3,4\n\n", target="target")
    np.testing.assert_array_equal(parsed.X, [[1.0, 2.0], [3.5, 4.0]])
    np.testing.assert_array_equal(parsed.y, [10.0, -1000.0])
    assert parsed.feature_names == ["a", "b"]
    assert parsed.target_name == "target"
    assert parsed.X.flags.c_contiguous


def test_csv_accepts_a_byte_order_mark_and_padded_cells():
    parsed = csv_reader.parse_csv("\ufeff x , y \n 1 , 2 \n".encode(), target="y")
    assert parsed.feature_names == ["x"]
    np.testing.assert_array_equal(parsed.y, [2.0])


@pytest.mark.parametrize(
    ("content", "target", "message"),
    [
        (b"a,b,c\n1,2,3\n", "target", "CSV has no column 'target'; columns are a, b, c"),
        (
            b"a,b\n1,2\n",
            None,
            "name the column to predict: add the query parameter ?target=NAME to a raw "
            "text/csv body, or the form field 'target' to a multipart upload; columns are a, b",
        ),
        (b"", "y", "CSV is empty; the first line must be a header naming the columns"),
        (b"a,y\n", "y", "CSV has a header but no data rows"),
        (b"y\n1\n", "y", "CSV has only the target column 'y'; at least one feature is needed"),
        (b"a,,y\n1,2,3\n", "y", "CSV header column 2 has no name; columns are a, , y"),
        (b"a,a,y\n1,2,3\n", "y", "CSV header repeats the column 'a'; columns are a, a, y"),
        (b"a,y\n1,2\n3\n", "y", "CSV line 3 has 1 field, expected 2"),
        (b"a,y\n1,2\n3,4,5\n", "y", "CSV line 3 has 3 fields, expected 2"),
        (
            b"a,y\n1,2\nx,4\n",
            "y",
            (
                "CSV line 3, column 'a': 'x' is not a number; to leave out a column of ids or "
                "text, upload with ignore=a, or keep it beside the features with keep=a"
            ),
        ),
        (
            b"a,y\n1,\n",
            "y",
            (
                "CSV line 2, column 'y' is empty; all values must be finite numbers (na=drop "
                "leaves out the rows with an empty cell)"
            ),
        ),
        (b"a,y\nnan,1\n", "y", "CSV line 2, column 'a' is NaN; all values must be finite numbers"),
        (
            b"a,y\n1,-inf\n",
            "y",
            "CSV line 2, column 'y' is -infinite; all values must be finite numbers",
        ),
        (b"a,y\n\xff,1\n", "y", "CSV is not UTF-8 text (byte 4 is invalid)"),
    ],
)
def test_bad_csv(content, target, message):
    with pytest.raises(IngestError) as error:
        csv_reader.parse_csv(content, target=target)
    assert str(error.value) == message


def test_json_rows_become_arrays_with_default_feature_names():
    parsed = ingest.parse_arrays([[1, 2], [3, 4]], [5, 6], None)
    np.testing.assert_array_equal(parsed.X, [[1.0, 2.0], [3.0, 4.0]])
    assert parsed.X.dtype == np.float64
    assert parsed.feature_names == ["x0", "x1"]


@pytest.mark.parametrize(
    ("X", "y", "names", "message"),
    [
        ([], [], None, "X is empty; at least one row is required"),
        ([[]], [1], None, "X row 0 has no values; at least one feature is required"),
        ([[1, 2], [3]], [1, 2], None, "X row 1 has 1 value, expected 2 (the length of row 0)"),
        ([[1], [2, 3, 4]], [1, 2], None, "X row 1 has 3 values, expected 1 (the length of row 0)"),
        (
            [[1, 2], [3, float("nan")]],
            [1, 2],
            None,
            "X[1][1] is NaN; all values must be finite numbers",
        ),
        ([[float("inf")]], [1], None, "X[0][0] is infinite; all values must be finite numbers"),
        ([[1]], [float("-inf")], None, "y[0] is -infinite; all values must be finite numbers"),
        ([[1], [2]], [], None, "y is empty; at least one value is required"),
        ([[1], [2]], [1], None, "y has 1 values but X has 2 rows"),
        ([[1, 2]], [1], ["a"], "feature_names has 1 names but X has 2 columns"),
        ([[1, 2]], [1], ["a", "a"], "feature_names[1] repeats the name 'a'"),
        ([[1, 2]], [1], ["a", ""], "feature_names[1] is empty"),
    ],
)
def test_bad_json_arrays(X, y, names, message):
    with pytest.raises(IngestError) as error:
        ingest.parse_arrays(X, y, names)
    assert str(error.value) == message


def test_npz_with_feature_names():
    X = np.arange(6, dtype=np.int32).reshape(3, 2)
    parsed = npz_reader.parse_npz(
        npz_bytes(X=X, y=np.array([1.0, 2.0, 3.0]), feature_names=np.array(["u", "v"]))
    )
    np.testing.assert_array_equal(parsed.X, X)
    assert parsed.X.dtype == np.float64
    assert parsed.feature_names == ["u", "v"]


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"X": np.ones((2, 2))}, "NPZ has no array 'y'; arrays are X"),
        ({"y": np.ones(2)}, "NPZ has no array 'X'; arrays are y"),
        ({"X": np.ones(2), "y": np.ones(2)}, "NPZ array 'X' must be 2-dimensional, got shape (2,)"),
        (
            {"X": np.ones((2, 1)), "y": np.ones((2, 1))},
            "NPZ array 'y' must be 1-dimensional, got shape (2, 1)",
        ),
        (
            {"X": np.array([["a"], ["b"]]), "y": np.ones(2)},
            "NPZ array 'X' must hold numbers, got dtype <U1",
        ),
        ({"X": np.ones((3, 1)), "y": np.ones(2)}, "y has 2 values but X has 3 rows"),
        ({"X": np.zeros((0, 2)), "y": np.zeros(0)}, "X is empty; at least one row is required"),
        (
            {"X": np.array([[1.0, np.nan]]), "y": np.ones(1)},
            "X[0][1] is NaN; all values must be finite numbers",
        ),
        (
            {"X": np.ones((1, 1)), "y": np.ones(1), "feature_names": np.ones(1)},
            "NPZ array 'feature_names' must be a 1-D array of strings",
        ),
    ],
)
def test_bad_npz(arrays, message):
    with pytest.raises(IngestError) as error:
        npz_reader.parse_npz(npz_bytes(**arrays))
    assert str(error.value) == message


def test_npz_with_object_arrays_is_refused_without_unpickling():
    content = npz_bytes(X=np.array([[1, "a"]], dtype=object), y=np.ones(1))
    with pytest.raises(IngestError, match=r"^NPZ array 'X' must hold numbers, got dtype object$"):
        npz_reader.parse_npz(content)


def test_a_file_that_is_not_npz():
    with pytest.raises(IngestError, match=r"^file is not a readable NPZ archive"):
        npz_reader.parse_npz(b"a,b\n1,2\n")
