"""Kept text columns of hostile uploads: a text's length is capped (MIXREG_MAX_TEXT_CELL_CHARS)
and the bytes of kept texts count towards MIXREG_MAX_DECODED_BYTES before they are expanded —
a dictionary-encoded Parquet column of a few kilobytes, or an NPZ string array padded to a wide
declared width, never becomes gigabytes in memory."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from service.checks import IngestError
from service.data import ingest
from service.data.column_choice import ColumnChoice
from service.data.ingest import DatasetLimits, DatasetTooLargeError
from service.data.readers import csv as csv_reader
from service.data.readers import npz as npz_reader
from service.data.readers import parquet as parquet_reader

SETTING = "MIXREG_MAX_TEXT_CELL_CHARS"


def dictionary_parquet(n_rows: int, text: str) -> bytes:
    """A Parquet file of ``n_rows`` rows whose kept column ``g`` repeats ``text`` (stored as
    one dictionary entry and ``n_rows`` indices: a few kilobytes)."""
    table = pa.table(
        {
            "x": np.arange(n_rows, dtype=np.float64) % 10,
            "y": np.ones(n_rows),
            "g": pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(n_rows, dtype=np.int32)), pa.array([text])
            ),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def problem(response) -> str:
    assert response.headers["content-type"].startswith("application/problem+json")
    return str(response.json()["detail"])


def test_a_long_text_in_a_dictionary_parquet_is_refused_naming_column_row_and_setting(
    client: TestClient, count_rows
):
    before = count_rows()
    body = dictionary_parquet(20_000, "t" * 5000)
    assert len(body) < 20_000
    response = client.post(
        "/datasets",
        files={"file": ("d.parquet", body, "application/vnd.apache.parquet")},
        data={"target": "y", "keep": "g"},
    )
    assert response.status_code == 422, response.text
    detail = problem(response)
    assert "kept column 'g'" in detail
    assert "5,000 characters in data row 1" in detail
    assert SETTING in detail
    assert count_rows() == before


@pytest.mark.parametrize("fast", [True, False])
def test_a_long_csv_cell_is_refused_by_either_reader(client: TestClient, monkeypatch, fast):
    if not fast:

        def refuse(*args, **kwargs):
            raise csv_reader._FastPathRefusedError

        monkeypatch.setattr(csv_reader, "_stage_csv_fast", refuse)
    rows = "".join(f"{i},{i % 3},k{i}\n" for i in range(50))
    rows += f"50,1,{'k' * 2000}\n"
    response = client.post(
        "/datasets",
        files={"file": ("d.csv", f"x,y,acct\n{rows}".encode(), "text/csv")},
        data={"target": "y", "keep": "acct"},
    )
    assert response.status_code == 422, response.text
    detail = problem(response)
    assert "kept column 'acct' holds a text of 2,000 characters in data row 51" in detail
    assert SETTING in detail


def test_a_wide_npz_string_array_is_refused_by_its_declared_width(client: TestClient):
    n_rows = 200
    wide = np.array(["g"] * n_rows, dtype="<U100000")  # 80 MB once decoded
    buffer = io.BytesIO()
    np.savez_compressed(buffer, X=np.ones((n_rows, 1)), y=np.ones(n_rows), g=wide)
    assert len(buffer.getvalue()) < 1_000_000
    response = client.post(
        "/datasets",
        files={"file": ("d.npz", buffer.getvalue(), "application/x-npz")},
        data={"keep": "g"},
    )
    assert response.status_code == 422, response.text
    detail = problem(response)
    assert "kept column 'g' holds a text of 100,000 characters" in detail
    assert SETTING in detail


def test_npz_kept_arrays_count_with_the_rows_towards_the_decoded_size():
    # X and y take 16,000 bytes as float64, the kept strings 40,000 at their declared width:
    # each fits 50,000 bytes alone, not together.
    buffer = io.BytesIO()
    np.savez(buffer, X=np.ones((1000, 1)), y=np.ones(1000), g=np.array(["abcdefghij"] * 1000))
    limits = DatasetLimits(max_decoded_bytes=50_000)
    with pytest.raises(DatasetTooLargeError, match="40,000 bytes of kept columns"):
        npz_reader.read_npz(io.BytesIO(buffer.getvalue()), limits=limits, keep=["g"])


def test_wide_enough_npz_strings_are_read_back_block_by_block(monkeypatch):
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 1000)
    texts = np.array([f"key-{i}" if i % 7 else "" for i in range(500)])
    buffer = io.BytesIO()
    np.savez(buffer, X=np.arange(500.0)[:, None], y=np.ones(500), g=texts, w=np.arange(500))
    limits = DatasetLimits(max_text_cell_chars=8)
    with npz_reader.read_npz(
        io.BytesIO(buffer.getvalue()), limits=limits, keep=["g", "w"]
    ) as staged:
        parsed = staged.to_parsed()
    assert parsed.extra["g"].tolist() == [str(t) if t else None for t in texts]
    np.testing.assert_array_equal(parsed.extra["w"], np.arange(500.0))


def test_dictionary_parquet_texts_are_read_back_in_slices(monkeypatch):
    monkeypatch.setattr(ingest, "BLOCK_BYTES", 4096)
    n_rows = 3000
    words = pa.array(["alpha", "b" * 300, "gamma"])
    indices = pa.array(np.arange(n_rows, dtype=np.int32) % 3)
    table = pa.table(
        {
            "x": np.arange(n_rows, dtype=np.float64),
            "y": np.ones(n_rows),
            "g": pa.DictionaryArray.from_arrays(indices, words),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    with parquet_reader.read_parquet(
        io.BytesIO(sink.getvalue()),
        target="y",
        choice=ColumnChoice(keep=("g",)),
        limits=DatasetLimits(max_text_cell_chars=300),
    ) as staged:
        parsed = staged.to_parsed()
    assert parsed.extra["g"].tolist() == [words[i % 3].as_py() for i in range(n_rows)]
    np.testing.assert_array_equal(parsed.X[:, 0], np.arange(n_rows, dtype=np.float64))


def test_a_too_long_text_is_named_in_a_later_block():
    limits = DatasetLimits(max_text_cell_chars=4)
    rows = "".join(f"{i},1,abc\n" for i in range(10)) + "10,1,abcdef\n"
    with pytest.raises(IngestError, match="6 characters in data row 11"):
        csv_reader.read_csv(
            io.BytesIO(f"x,y,t\n{rows}".encode()),
            target="y",
            limits=limits,
            choice=ColumnChoice(keep=("t",)),
        )


PEAK_OF_A_DICTIONARY_PARQUET = """
import io, json, resource, sys
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from service.data import column_choice, ingest
from service.data.readers import parquet as parquet_reader
n_rows = 200_000
table = pa.table({
    "x": np.arange(n_rows, dtype=np.float64) % 10,
    "y": np.ones(n_rows),
    "g": pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n_rows, dtype=np.int32)), pa.array(["t" * 5000])
    ),
})
sink = io.BytesIO()
pq.write_table(table, sink, compression="zstd")
data = sink.getvalue()
del table, sink
limits = ingest.DatasetLimits(max_decoded_bytes=256 * 2**20)  # no cap on a text's length
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    parquet_reader.read_parquet(
        io.BytesIO(data), target="y", limits=limits, choice=column_choice.ColumnChoice(keep=("g",))
    ).close()
    outcome = "read"
except ingest.DatasetTooLargeError as exc:
    outcome = str(exc)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"bytes": len(data), "added": (after - before) * 1024, "outcome": outcome}))
"""


def test_a_dictionary_parquet_is_refused_before_its_texts_are_expanded():
    # 200,000 rows of one 5,000-character text: 1 GB once expanded, from a file of a few
    # kilobytes. Measured in a process of its own: the peak resident memory only grows.
    result = subprocess.run(
        [sys.executable, "-c", PEAK_OF_A_DICTIONARY_PARQUET],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    measured = json.loads(result.stdout)
    assert measured["bytes"] < 64 * 1024
    assert "bytes of kept columns; at most 268,435,456 are accepted" in measured["outcome"]
    assert "MIXREG_MAX_DECODED_BYTES" in measured["outcome"]
    added = measured["added"]
    assert added < 64 * 2**20, f"reading added {added / 2**20:.0f} MiB to the peak"


PEAK_OF_A_PLAIN_PARQUET = """
import json, resource, sys
from service.data import column_choice, ingest
from service.data.readers import parquet as parquet_reader
limits = ingest.DatasetLimits(max_decoded_bytes=64 * 2**20)  # no cap on a text's length
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    with open(sys.argv[1], "rb") as source:
        parquet_reader.read_parquet(
            source, target="y", limits=limits, choice=column_choice.ColumnChoice(keep=("g",))
        ).close()
    outcome = "read"
except ingest.DatasetTooLargeError as exc:
    outcome = str(exc)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"added": (after - before) * 1024, "outcome": outcome}))
"""


def test_a_plain_parquet_text_column_is_refused_by_its_stored_size_before_it_is_read(tmp_path):
    # 40,000 texts of 5,000 characters stored plain (no dictionary), compressed to almost
    # nothing: 200 MB once read; the footer's uncompressed sizes tell before any page is read.
    n_rows = 40_000
    texts = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n_rows, dtype=np.int32)), pa.array(["t" * 5000])
    ).dictionary_decode()
    table = pa.table({"x": np.zeros(n_rows), "y": np.ones(n_rows), "g": texts})
    path = tmp_path / "plain.parquet"
    pq.write_table(table, path, compression="zstd", use_dictionary=False)
    del table, texts
    assert path.stat().st_size < 1_000_000
    result = subprocess.run(
        [sys.executable, "-c", PEAK_OF_A_PLAIN_PARQUET, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    measured = json.loads(result.stdout)
    assert "bytes of kept columns; at most 67,108,864 are accepted" in measured["outcome"]
    added = measured["added"]
    assert added < 16 * 2**20, f"reading added {added / 2**20:.0f} MiB to the peak"
