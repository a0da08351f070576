"""The CSV reader: a header line, then rows, read in blocks (pyarrow's reader where it can,
an exact reader where it cannot), each block checked and staged."""

from __future__ import annotations

import codecs
import csv
import io
import math
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from service.checks import FINITE_HINT, IngestError, count_text, describe_non_finite
from service.data.column_choice import (
    CSV_DELIMITERS,
    EVERY_COLUMN,
    ColumnChoice,
    check_column_names,
    delimiter_hint,
)
from service.data.ingest import (
    NA_DROP,
    NA_ERROR,
    NO_LIMITS,
    BinaryFile,
    DatasetLimits,
    ParsedDataset,
    check_na_policy,
    rows_per_block,
)
from service.data.staging import (
    TEXT,
    StagedDataset,
    count_dropped,
    dropped_text,
    release_arrow_memory,
    staged_dataset,
)

if TYPE_CHECKING:
    from _csv import Reader

FloatArray = NDArray[np.float64]

_BOM = codecs.BOM_UTF8
_TEXT_BLOCK_BYTES = 1 << 20
CSV_BLOCK_BYTES = 4 * 1024 * 1024
"""Bytes of CSV text pyarrow parses at a time."""


def _csv_lines(source: BinaryFile) -> Iterator[str]:
    """The lines of a UTF-8 CSV (a leading byte order mark dropped), with their line ends.

    Lines end at ``\\n``, ``\\r\\n`` or ``\\r``, as the ``csv`` module expects with
    ``newline=""``. Invalid UTF-8 is reported with its byte position in the file. A line that
    spans many blocks is joined once, when it ends, so reading costs time linear in its length.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    consumed = 0
    unfinished: list[str] = []
    first = True
    while True:
        block = source.read(_TEXT_BLOCK_BYTES)
        if first:
            first = False
            if block.startswith(_BOM):
                block = block[len(_BOM) :]
                consumed += len(_BOM)
        final = not block
        buffered = len(decoder.getstate()[0])
        try:
            text = decoder.decode(block, final=final)
        except UnicodeDecodeError as exc:
            position = consumed - buffered + exc.start
            raise IngestError(f"CSV is not UTF-8 text (byte {position} is invalid)") from None
        consumed += len(block)
        if not final and "\n" not in text and "\r" not in text:
            unfinished.append(text)  # the same line goes on
            continue
        unfinished.append(text)
        pending = "".join(unfinished)
        unfinished = []
        lines = list(io.StringIO(pending, newline=""))
        # Keep an unfinished last line (or a '\r' that a '\n' in the next block may complete).
        if not final and lines and (not lines[-1].endswith(("\n", "\r")) or lines[-1][-1] == "\r"):
            unfinished.append(lines.pop())
        yield from lines
        if final:
            return


def detect_delimiter(header: str) -> str:
    """The delimiter of a CSV header line: the candidate it holds most (a comma on a tie)."""
    counts = [header.count(delimiter) for delimiter in CSV_DELIMITERS]
    return CSV_DELIMITERS[counts.index(max(counts))] if max(counts) else ","


def _read_csv_header(reader: Reader) -> list[str]:
    header = next(reader, None)
    if header is None or not any(cell.strip() for cell in header):
        raise IngestError("CSV is empty; the first line must be a header naming the columns")
    return [cell.strip() for cell in header]


class _PrivateReader(io.RawIOBase):
    """Reads of ``source`` from a position of its own (``os.pread``, or a copy of the bytes of
    an in-memory file), never moving the position of ``source``.

    pyarrow's CSV reader reads ahead on a thread of its own, and may still be reading when it
    has refused a block and the exact reader starts over from the first byte: sharing the file
    position, the two would each see pieces of the file (a long line read as a short one).
    """

    def __init__(self, source: BinaryFile) -> None:
        super().__init__()
        self._position = 0
        self._fd: int | None = None
        self._memory: memoryview | None = None
        try:
            self._fd = source.fileno()  # a spooled file moves to disk here
        except (AttributeError, OSError, ValueError):
            if not isinstance(source, io.BytesIO):
                raise TypeError(f"cannot read {type(source).__name__} privately") from None
            self._memory = memoryview(source.getvalue())
        if self._fd is not None:
            source.flush()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            self._position = offset
        elif whence == os.SEEK_CUR:
            self._position += offset
        else:
            self._position = self._size() + offset
        return self._position

    def _size(self) -> int:
        if self._memory is not None:
            return len(self._memory)
        assert self._fd is not None
        return os.fstat(self._fd).st_size

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._memory is not None:
            chunk = self._memory[self._position : self._position + len(view)]
            view[: len(chunk)] = chunk
            count = len(chunk)
        else:
            assert self._fd is not None
            data = os.pread(self._fd, len(view), self._position)
            count = len(data)
            view[:count] = data
        self._position += count
        return count


class _FastPathRefusedError(Exception):
    """The fast CSV reader met something it does not read exactly as the csv module does."""


def _csv_delimiter(source: BinaryFile, delimiter: str | None) -> str:
    """``delimiter``, checked, or the one the first line of ``source`` holds most."""
    if delimiter is not None:
        if len(delimiter) != 1 or delimiter in '\r\n"':
            raise IngestError(
                f"delimiter must be one character other than a quote or a line end, "
                f"got {delimiter!r}"
            )
        return delimiter
    first_line = next(_csv_lines(source), "")
    source.seek(0)
    return detect_delimiter(first_line)


def read_csv(
    source: BinaryFile,
    *,
    target: str | None,
    limits: DatasetLimits = NO_LIMITS,
    choice: ColumnChoice = EVERY_COLUMN,
    delimiter: str | None = None,
    na: str = NA_ERROR,
) -> StagedDataset:
    """Read a CSV with a header row; ``target`` names the column to predict, ``choice`` the
    features, ``delimiter`` what separates the fields (default: the one of ``,;<tab>|`` the
    header holds most); ``na`` what an empty feature or target cell does: ``"error"`` refuses
    the upload naming it, ``"drop"`` leaves its row out, counted per column in
    ``StagedDataset.dropped_rows``.

    The rows are read by pyarrow's streaming CSV reader. When it refuses a block (a value
    that is not a number, a short line, an empty cell...), the file is read again from the
    start by Python's ``csv`` module, which names the exact line and column of the problem (or
    reads a file that only pyarrow found odd, such as a line of blanks).
    """
    check_na_policy(na)
    delimiter = _csv_delimiter(source, delimiter)
    reader = csv.reader(_csv_lines(source), delimiter=delimiter)
    try:
        columns = _read_csv_header(reader)
        header_lines = reader.line_num
    except csv.Error as exc:
        raise IngestError(f"CSV line {reader.line_num} cannot be read: {exc}") from None
    feature_names = check_column_names(
        columns,
        source="CSV",
        what="CSV header",
        target=target,
        limits=limits,
        choice=choice,
        hint=delimiter_hint(columns),
    )
    assert target is not None  # checked with the header
    # The columns read: the features, the target, then the kept ones; the others (ids, text)
    # are never parsed.
    used = [*(columns.index(name) for name in feature_names), columns.index(target)]
    kept_at = [columns.index(name) for name in choice.keep]
    kept = dict.fromkeys(choice.keep, TEXT)
    staged = staged_dataset(feature_names, target, limits, kept)
    try:
        _stage_csv_fast(
            _PrivateReader(source),
            staged,
            n_columns=len(columns),
            header_lines=header_lines,
            used=used,
            kept_at=kept_at,
            delimiter=delimiter,
            na=na,
        )
    except _FastPathRefusedError:
        staged.close()
        source.seek(0)
        staged = staged_dataset(feature_names, target, limits, kept)
        try:
            _stage_csv_exact(
                source,
                staged,
                n_columns=len(columns),
                used=used,
                kept_at=kept_at,
                delimiter=delimiter,
                na=na,
            )
        except BaseException:
            staged.close()
            raise
    except BaseException:
        staged.close()
        raise
    finally:
        release_arrow_memory()
    if staged.n_rows == 0:
        staged.close()
        if staged.dropped_rows:
            raise IngestError(
                f"every CSV row has an empty cell (rows left out by na=drop, per column: "
                f"{dropped_text(staged.dropped_rows)})"
            )
        raise IngestError("CSV has a header but no data rows")
    return staged


def _stage_csv_fast(
    source: BinaryFile | _PrivateReader,
    staged: StagedDataset,
    *,
    n_columns: int,
    header_lines: int,
    used: list[int],
    kept_at: list[int],
    delimiter: str,
    na: str = NA_ERROR,
) -> None:
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    names = [f"c{index}" for index in range(n_columns)]
    numbers = [names[index] for index in used]
    texts = [names[index] for index in kept_at]
    try:
        reader = pa_csv.open_csv(
            source,
            read_options=pa_csv.ReadOptions(
                skip_rows=header_lines,
                column_names=names,
                block_size=CSV_BLOCK_BYTES,
                # One thread: pyarrow's pool would take both cores from the requests the API
                # answers while a big upload is parsed (the upload is slower, the rest is not).
                use_threads=False,
            ),
            parse_options=pa_csv.ParseOptions(delimiter=delimiter),
            convert_options=pa_csv.ConvertOptions(
                column_types={
                    **dict.fromkeys(numbers, pa.float64()),
                    **dict.fromkeys(texts, pa.string()),
                },
                include_columns=[*numbers, *texts],
                null_values=[""],
                strings_can_be_null=False,
                quoted_strings_can_be_null=True,
            ),
        )
        for batch in reader:
            # The batch holds the used columns in the order of ``used`` (features, then the
            # target), then the kept ones.
            columns = [
                batch.column(index).to_numpy(zero_copy_only=False) for index in range(len(used))
            ]
            kept = [batch.column(len(used) + index) for index in range(len(texts))]
            if any(batch.column(index).null_count for index in range(len(used))):
                columns, kept = _drop_blank_rows(batch, columns, kept, staged, na)
            X = np.empty((len(columns[0]), len(used) - 1), dtype=np.float64)
            for position, column in enumerate(columns[:-1]):
                X[:, position] = column
            y = np.asarray(columns[-1], dtype=np.float64)
            if not (np.isfinite(X).all() and np.isfinite(y).all()):
                raise _FastPathRefusedError  # the exact reader names the line and column
            staged.append(X, y, dict(zip(staged.kept, kept, strict=True)))
    except pa.ArrowException:
        raise _FastPathRefusedError from None


def _drop_blank_rows(
    batch: Any,
    columns: list[NDArray[Any]],
    kept: list[Any],
    staged: StagedDataset,
    na: str = NA_ERROR,
) -> tuple[list[NDArray[Any]], list[Any]]:
    """The columns (and kept text columns) without the rows whose every cell is empty (as the
    csv reader skips them); a row with some empty cells but not all is refused, or with
    ``na="drop"`` left out too when a feature or the target is empty (counted per column)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = np.column_stack(
        [
            *(
                batch.column(index).is_null().to_numpy(zero_copy_only=False)
                for index in range(len(columns))
            ),
            *(
                pc.equal(pc.utf8_trim_whitespace(texts), "")
                .fill_null(True)
                .to_numpy(zero_copy_only=False)
                for texts in kept
            ),
        ]
    )
    blank = empty.all(axis=1)
    partial: NDArray[np.bool_] = np.asarray(empty.any(axis=1) & ~blank)
    if partial.any():
        if na != NA_DROP:
            raise _FastPathRefusedError
        missing = empty[:, : len(columns)] & partial[:, np.newaxis]
        count_dropped(staged, missing, [*staged.feature_names, str(staged.target_name)])
        # A row whose gaps are all in kept columns stays: a kept column may have gaps.
        blank |= missing.any(axis=1)
    keep_rows = pa.array(~blank)
    return [column[~blank] for column in columns], [texts.filter(keep_rows) for texts in kept]


def _lines_of_at_most(lines: Iterator[str], n_fields: int, delimiter: str) -> Iterator[str]:
    """``lines``, refusing one without quotes that has more than ``n_fields`` fields before
    the csv module splits it (a line of millions of fields would become millions of strings)."""
    for number, line in enumerate(lines, start=1):
        if '"' not in line:
            fields = line.count(delimiter) + 1
            if fields > n_fields:
                raise IngestError(
                    f"CSV line {number} has {count_text(fields, 'field')}, expected {n_fields}"
                )
        yield line


def _stage_csv_exact(
    source: BinaryFile,
    staged: StagedDataset,
    *,
    n_columns: int,
    used: list[int],
    kept_at: list[int],
    delimiter: str,
    na: str = NA_ERROR,
) -> None:
    used_names = [*staged.feature_names, str(staged.target_name)]
    reader = csv.reader(
        _lines_of_at_most(_csv_lines(source), n_columns, delimiter), delimiter=delimiter
    )
    try:
        columns = _read_csv_header(reader)
        block_rows = rows_per_block(len(used) + len(kept_at))
        values: list[list[float]] = []
        texts: list[list[str]] = []
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                raise IngestError(
                    f"CSV line {line} has {count_text(len(row), 'field')}, expected {len(columns)}"
                )
            if na == NA_DROP:
                missing = np.array([not row[index].strip() for index in used])
                if missing.any():
                    count_dropped(staged, missing[np.newaxis, :], used_names)
                    continue
            values.append(
                [
                    _parse_csv_number(
                        row[index], line=line, column=columns[index], feature=index != used[-1]
                    )
                    for index in used
                ]
            )
            texts.append([row[index] for index in kept_at])
            if len(values) == block_rows:
                _stage_csv_rows(staged, values, texts)
                values, texts = [], []
        if values:
            _stage_csv_rows(staged, values, texts)
    except csv.Error as exc:
        raise IngestError(f"CSV line {reader.line_num} cannot be read: {exc}") from None


def _stage_csv_rows(
    staged: StagedDataset, values: list[list[float]], texts: list[list[str]]
) -> None:
    """Stage rows of the used columns, the target last, and their kept cells."""
    table = np.asarray(values, dtype=np.float64)
    X = np.ascontiguousarray(table[:, :-1])
    y = np.ascontiguousarray(table[:, -1])
    cells = np.asarray(texts, dtype=object).reshape(len(texts), len(staged.kept))
    staged.append(X, y, {name: cells[:, index] for index, name in enumerate(staged.kept)})


def _parse_csv_number(cell: str, *, line: int, column: str, feature: bool = False) -> float:
    text = cell.strip()
    if not text:
        raise IngestError(
            f"CSV line {line}, column '{column}' is empty; {FINITE_HINT} (na=drop leaves out "
            f"the rows with an empty cell)"
        )
    try:
        value = float(text)
    except ValueError:
        # A text cell in a feature is most often an id or a title column: say how to leave
        # it out or keep it, in the upload's own words.
        fix = (
            f"; to leave out a column of ids or text, upload with ignore={column}, or keep it "
            f"beside the features with keep={column}"
            if feature
            else ""
        )
        raise IngestError(
            f"CSV line {line}, column '{column}': '{text}' is not a number{fix}"
        ) from None
    if not math.isfinite(value):
        raise IngestError(
            f"CSV line {line}, column '{column}' is {describe_non_finite(value)}; {FINITE_HINT}"
        )
    return value


def parse_csv(data: bytes, *, target: str | None) -> ParsedDataset:
    """Read a CSV held in memory (see ``read_csv``)."""
    with read_csv(io.BytesIO(data), target=target) as staged:
        return staged.to_parsed()
