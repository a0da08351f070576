"""Every SQL statement of the project: reads and conditional writes of datasets, jobs, models.

Functions take the session first and everything else by keyword. They flush so that generated
values and constraint errors surface at once, but never commit: the caller's unit of work
(``session_scope``) decides.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Select,
    case,
    delete,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session, object_session
from sqlalchemy.sql.dml import Delete, Update

from models_store.base import UTCDateTime
from models_store.codecs import (
    COLUMN_TYPES,
    NUMBER,
    STRING,
    GroupTable,
    decode_arrays,
    decode_columns,
    decode_group_table,
    decode_matrix,
    decode_vector,
    encode_arrays,
    encode_columns,
    encode_group_table,
    encode_matrix,
    encode_vector,
    to_json_value,
)
from models_store.tables import (
    IDEMPOTENCY_SCOPE_WITHOUT_KEY,
    TERMINAL_JOB_STATUSES,
    Dataset,
    DatasetChunk,
    Job,
    KeyedJobShard,
    KeyedJobShardClaim,
    KeyedModelChunk,
    Model,
)

_ID_PATTERN = re.compile(r"[0-9a-f]{32}")


def _new_id() -> str:
    return uuid.uuid4().hex


def new_id() -> str:
    """A new id of the form of the generated ones (a uuid4 in hex)."""
    return _new_id()


def _is_id(value: str) -> bool:
    """True if ``value`` has the form of a generated id; others name nothing and are never
    sent to the database (PostgreSQL refuses NUL characters in text, for one)."""
    return _ID_PATTERN.fullmatch(value) is not None


def utcnow() -> datetime:
    """Now, in UTC: the time every row of the store records (one clock for all of them)."""
    return datetime.now(UTC)


def _execute_counting(session: Session, statement: Update | Delete) -> int:
    # Bulk statements leave the identity map alone; callers expire what they changed.
    result = session.execute(statement, execution_options={"synchronize_session": False})
    return cast(CursorResult[Any], result).rowcount


def _update_job(
    session: Session, job_id: str, *conditions: ColumnElement[bool], **values: Any
) -> bool:
    """Apply ``values`` to the job if it still meets ``conditions``; True if it did.

    The conditions make each state change a compare-and-set, so a worker that lost its job
    (requeued, claimed by another, finished) cannot overwrite it.
    """
    statement = update(Job).where(Job.id == job_id, *conditions).values(**values)
    changed = _execute_counting(session, statement) == 1
    cached = session.identity_map.get(Session.identity_key(Job, job_id))
    if cached is not None:
        session.expire(cached)
    if changed and "status" in values:
        # However a job ends (failed, cancelled, reaped, released), in the transaction that
        # ends it: nothing else would ever read a finished job's shards again.
        _delete_shards_if_finished(session, job_id)
    return changed


def _check_page(limit: int, offset: int) -> None:
    if limit < 0 or offset < 0:
        raise ValueError(f"limit and offset must be non-negative, got {limit} and {offset}")


def _count(session: Session, query: Select[Any]) -> int:
    return session.scalar(select(func.count()).select_from(query.subquery())) or 0


PageKey = tuple[datetime, str]
"""Where a page of a newest-first list ends: the ``(created_at, id)`` of its last row."""


def _newest_first(
    session: Session,
    query: Select[Any],
    table: type[Dataset] | type[Job] | type[Model],
    *,
    limit: int,
    offset: int,
    after: PageKey | None,
) -> tuple[list[Any], int]:
    """A page of ``query`` newest first, and the total count of ``query``.

    ``after`` (keyset pagination) starts the page right after the row with that key: rows
    added meanwhile are newer and come before it, so paging neither skips nor repeats a row,
    which an ``offset`` does when rows arrive.
    """
    _check_page(limit, offset)
    total = _count(session, query)
    if after is not None:
        created_at, row_id = after
        query = query.where(
            (table.created_at < created_at)
            | ((table.created_at == created_at) & (table.id < row_id))
        )
    page = session.scalars(
        query.order_by(table.created_at.desc(), table.id.desc()).limit(limit).offset(offset)
    )
    return list(page), total


# Datasets ---------------------------------------------------------------------------------------


DATASET_CHUNK_BYTES = 8 * 1024 * 1024
"""About this many bytes of features per stored chunk (docs/adr/0009)."""

FloatArray = npt.NDArray[np.float64]


def dataset_chunk_rows(n_features: int) -> int:
    """Rows per stored chunk of a dataset with ``n_features`` features (at least one)."""
    return max(1, DATASET_CHUNK_BYTES // (8 * max(1, n_features)))


def column_type_of(values: npt.NDArray[Any]) -> str:
    """The extra-column type of a 1-D array: ``number`` for booleans, integers and floats,
    ``string`` for anything else (text, or objects holding ``str`` and ``None``)."""
    return NUMBER if values.dtype.kind in "biuf" else STRING


def extra_row_bytes(
    n_rows: int, columns: Mapping[str, npt.NDArray[Any]], types: Mapping[str, str]
) -> npt.NDArray[np.int64]:
    """The bytes of each row's extra values: 8 per number, a text's UTF-8 length (0 when
    missing)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    row_bytes = np.zeros(n_rows, dtype=np.int64)
    for name, values in columns.items():
        if types[name] == NUMBER:
            row_bytes += 8
        else:
            lengths = pc.binary_length(pa.array(np.asarray(values, dtype=object), pa.string()))
            row_bytes += lengths.fill_null(0).to_numpy().astype(np.int64)
    return row_bytes


def chunk_stops(row_bytes: npt.NDArray[np.int64], max_bytes: int) -> npt.NDArray[np.int64]:
    """Where to cut rows of ``row_bytes`` bytes each into consecutive chunks of at most
    ``max_bytes`` (a single row may be more): the exclusive end of each chunk, the last one
    ``len(row_bytes)``."""
    ends = np.cumsum(row_bytes)
    stops: list[int] = []
    start, taken = 0, 0
    while start < len(row_bytes):
        # The first row past the budget ends the chunk; a chunk holds at least one row.
        stop = int(np.searchsorted(ends, taken + max_bytes, side="right"))
        stop = max(stop, start + 1)
        stops.append(stop)
        taken = int(ends[stop - 1])
        start = stop
    return np.asarray(stops, dtype=np.int64)


def _check_extra(
    columns: Mapping[str, npt.NDArray[Any]], extra_columns: Sequence[Mapping[str, str]], n_rows: int
) -> None:
    names = [column["name"] for column in extra_columns]
    if sorted(columns) != sorted(names):
        raise ValueError(f"extra columns must be {names}, got {list(columns)}")
    for name, values in columns.items():
        if values.shape != (n_rows,):
            raise ValueError(
                f"extra column '{name}' must have shape ({n_rows},), got {values.shape}"
            )


def _check_block(X: FloatArray, y: FloatArray, n_features: int) -> None:
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D matrix, got shape {X.shape}")
    if X.shape[1] != n_features:
        raise ValueError(f"X must have {n_features} columns, got shape {X.shape}")
    if y.shape != (X.shape[0],):
        raise ValueError(f"y must have shape ({X.shape[0]},), got {y.shape}")
    if not (np.isfinite(X).all() and np.isfinite(y).all()):
        raise ValueError("X and y must contain only finite numbers")


def create_dataset(
    session: Session,
    *,
    X: npt.ArrayLike,
    y: npt.ArrayLike,
    feature_names: Sequence[str] | None,
    target_name: str | None,
    name: str | None,
    extra: Mapping[str, npt.ArrayLike] | None = None,
) -> Dataset:
    """Store a design matrix ``X`` (n_rows, n_features) and target ``y`` (n_rows,), and the
    1-D ``extra`` columns (one value per row) beside them.

    Without ``feature_names`` the features are called ``x0, x1, ...``. An extra column of
    numbers (booleans, integers, floats) is stored as ``number``, any other as ``string``
    (``str`` values, ``None`` where missing).
    """
    X_array = np.asarray(X, dtype=np.float64)
    y_array = np.asarray(y, dtype=np.float64)
    if X_array.ndim != 2:
        raise ValueError(f"X must be a 2-D matrix, got shape {X_array.shape}")
    n_features = X_array.shape[1]
    _check_block(X_array, y_array, n_features)
    columns = {column: np.asarray(values) for column, values in (extra or {}).items()}
    types = {column: column_type_of(values) for column, values in columns.items()}
    extra_columns = [{"name": column, "type": types[column]} for column in columns]
    _check_extra(columns, extra_columns, len(y_array))
    dataset = start_dataset(
        session,
        n_features=n_features,
        feature_names=feature_names,
        target_name=target_name,
        name=name,
        extra_columns=extra_columns,
    )
    # As dataset_chunk_rows counts a plain dataset's chunk: its features, and the extra values.
    row_bytes = np.full(len(y_array), 8 * n_features, dtype=np.int64)
    row_bytes += extra_row_bytes(len(y_array), columns, types)
    start = 0
    for stop in chunk_stops(row_bytes, DATASET_CHUNK_BYTES):
        add_dataset_chunk(
            session,
            dataset=dataset,
            X=X_array[start:stop],
            y=y_array[start:stop],
            extra={column: values[start:stop] for column, values in columns.items()},
        )
        start = int(stop)
    return complete_dataset(session, dataset=dataset, n_rows=len(y_array))


def create_dataset_from_blocks(
    session: Session,
    *,
    blocks: Iterable[tuple[FloatArray, FloatArray]],
    n_features: int,
    feature_names: Sequence[str] | None,
    target_name: str | None,
    name: str | None,
) -> Dataset:
    """Store a dataset given as consecutive blocks of rows ``(X_block, y_block)``.

    Each block becomes one chunk, written as it comes, so only one block needs to be in memory.
    """
    dataset = start_dataset(
        session,
        n_features=n_features,
        feature_names=feature_names,
        target_name=target_name,
        name=name,
    )
    n_rows = 0
    for X_block, y_block in blocks:
        n_rows += add_dataset_chunk(session, dataset=dataset, X=X_block, y=y_block)
    return complete_dataset(session, dataset=dataset, n_rows=n_rows)


def start_dataset(
    session: Session,
    *,
    n_features: int,
    feature_names: Sequence[str] | None,
    target_name: str | None,
    name: str | None,
    extra_columns: Sequence[Mapping[str, str]] = (),
) -> Dataset:
    """Insert a dataset with no rows yet: invisible to every read until
    :func:`complete_dataset` gives it its rows (a stored dataset has at least one row).

    Without ``feature_names`` the features are called ``x0, x1, ...``. ``extra_columns``
    lists the columns kept beside the features and the target, each ``{"name": ...,
    "type": "number" | "string"}``; every chunk then holds their values.
    """
    kept = [{"name": str(column["name"]), "type": str(column["type"])} for column in extra_columns]
    clashing = {column["name"] for column in kept} & {*(feature_names or ()), target_name}
    if clashing or len({column["name"] for column in kept}) != len(kept):
        raise ValueError(f"extra column names must be new and distinct, got {kept}")
    if any(column["type"] not in COLUMN_TYPES for column in kept):
        raise ValueError(f"extra column types must be one of {COLUMN_TYPES}, got {kept}")
    names = list(feature_names) if feature_names is not None else None
    if names is None:
        names = [f"x{j}" for j in range(n_features)]
    if len(names) != n_features:
        raise ValueError(f"got {len(names)} feature names for {n_features} features")
    dataset = Dataset(
        id=_new_id(),
        name=name,
        n_rows=0,
        n_features=n_features,
        feature_names=names,
        target_name=target_name,
        created_at=utcnow(),
        extra_columns=kept,
    )
    session.add(dataset)
    session.flush()
    return dataset


def add_dataset_chunk(
    session: Session,
    *,
    dataset: Dataset,
    X: FloatArray,
    y: FloatArray,
    extra: Mapping[str, npt.ArrayLike] | None = None,
) -> int:
    """Append the rows ``(X, y)`` to ``dataset`` (started by :func:`start_dataset`) as its next
    chunk, with the rows' values of each of the dataset's extra columns (``extra``, required
    when it has some); return how many rows it holds (none stored for an empty block).

    ``dataset.n_rows`` is not touched; the chunk's position follows the chunks stored so far,
    so a dataset may be written in several units of work.
    """
    X_array = np.asarray(X, dtype=np.float64)
    y_array = np.asarray(y, dtype=np.float64)
    _check_block(X_array, y_array, dataset.n_features)
    columns = {column: np.asarray(values) for column, values in (extra or {}).items()}
    _check_extra(columns, dataset.extra_columns, len(y_array))
    types = _column_types(dataset)
    extra_data = encode_columns(columns, types) if dataset.extra_columns else None
    if len(y_array) == 0:
        return 0
    position = session.scalar(
        select(func.coalesce(func.max(DatasetChunk.position) + 1, 0)).where(
            DatasetChunk.dataset_id == dataset.id
        )
    )
    # A Core insert: the chunk's bytes are not kept in the session's identity map.
    session.execute(
        insert(DatasetChunk).values(
            dataset_id=dataset.id,
            position=position,
            n_rows=len(y_array),
            x_data=encode_matrix(X_array),
            y_data=encode_vector(y_array),
            extra_data=extra_data,
        )
    )
    return len(y_array)


def _column_types(dataset: Dataset) -> dict[str, str]:
    return {column["name"]: column["type"] for column in dataset.extra_columns}


def complete_dataset(session: Session, *, dataset: Dataset, n_rows: int) -> Dataset:
    """Give ``dataset`` its ``n_rows`` rows, stored as chunks by :func:`add_dataset_chunk`: from
    now on reads see it."""
    if n_rows == 0:
        raise ValueError("a dataset needs at least one row")
    dataset = session.merge(dataset)
    dataset.n_rows = n_rows
    session.flush()
    return dataset


def delete_incomplete_dataset(session: Session, *, dataset_id: str) -> None:
    """Delete a dataset that :func:`complete_dataset` never completed, and its chunks."""
    _execute_counting(session, delete(Dataset).where(Dataset.id == dataset_id, Dataset.n_rows == 0))


def get_dataset(session: Session, *, dataset_id: str) -> Dataset | None:
    """Return the dataset with this id, or None (also while it is being stored)."""
    if not _is_id(dataset_id):
        return None
    dataset = session.get(Dataset, dataset_id)
    return dataset if dataset is not None and dataset.n_rows > 0 else None


def iter_dataset_blocks(
    session: Session, *, dataset: Dataset
) -> Iterator[tuple[FloatArray, FloatArray]]:
    """The stored rows of ``dataset`` as consecutive blocks ``(X_block, y_block)``, in order.

    The chunks are fetched one at a time (a server-side cursor on PostgreSQL), so memory holds
    one block. Raises ``ValueError`` if the chunks do not add up to the dataset's shape.
    """
    rows = session.execute(
        select(DatasetChunk.n_rows, DatasetChunk.x_data, DatasetChunk.y_data)
        .where(DatasetChunk.dataset_id == dataset.id)
        .order_by(DatasetChunk.position),
        execution_options={"yield_per": 1},
    )
    n_seen = 0
    for n_rows, x_data, y_data in rows:
        yield (
            decode_matrix(bytes(x_data), n_rows, dataset.n_features),
            decode_vector(bytes(y_data), n_rows),
        )
        n_seen += n_rows
    if n_seen != dataset.n_rows:
        raise ValueError(
            f"dataset {dataset.id} has {dataset.n_rows} rows but its chunks hold {n_seen}"
        )


MIN_SAMPLED_CHUNKS = 4
"""A sample of a dataset's rows is drawn from at least this many chunks (all of them if it has
fewer): rows of one chunk are consecutive in the upload, and a sorted file would otherwise show
one stretch of it."""


def sample_dataset_rows(
    session: Session, *, dataset: Dataset, max_rows: int, seed: int = 0
) -> tuple[FloatArray, FloatArray]:
    """``max_rows`` rows of ``dataset`` drawn at random (seeded), in stored order; all of its
    rows if it has no more.

    Only the chunks the sample needs are read, one at a time: chunks drawn at random until
    they hold ``max_rows`` rows (at least ``MIN_SAMPLED_CHUNKS``), then the rows among them.
    Time and memory grow with the sample and the chunk size, not with the dataset.
    """
    if dataset.n_rows <= max_rows:
        return load_dataset_arrays(dataset)
    sizes = session.execute(
        select(DatasetChunk.position, DatasetChunk.n_rows)
        .where(DatasetChunk.dataset_id == dataset.id)
        .order_by(DatasetChunk.position)
    ).all()
    positions = np.array([position for position, _ in sizes], dtype=np.int64)
    counts = np.array([n_rows for _, n_rows in sizes], dtype=np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(positions))
    holding_enough = int(np.searchsorted(np.cumsum(counts[order]), max_rows)) + 1
    chosen = np.sort(order[: max(holding_enough, MIN_SAMPLED_CHUNKS)])
    offsets = np.concatenate(([0], np.cumsum(counts[chosen])))
    drawn = np.sort(rng.choice(int(offsets[-1]), size=max_rows, replace=False))
    drawn_per_chunk = np.split(drawn, np.searchsorted(drawn, offsets[1:-1]))
    rows = session.execute(
        select(DatasetChunk.n_rows, DatasetChunk.x_data, DatasetChunk.y_data)
        .where(
            DatasetChunk.dataset_id == dataset.id,
            DatasetChunk.position.in_(positions[chosen].tolist()),
        )
        .order_by(DatasetChunk.position),
        execution_options={"yield_per": 1},
    )
    X_parts, y_parts = [], []
    for (n_rows, x_data, y_data), offset, drawn_here in zip(
        rows, offsets[:-1], drawn_per_chunk, strict=True
    ):
        mine = drawn_here - offset
        X_parts.append(decode_matrix(bytes(x_data), n_rows, dataset.n_features)[mine])
        y_parts.append(decode_vector(bytes(y_data), n_rows)[mine])
    return np.concatenate(X_parts), np.concatenate(y_parts)


def read_dataset_rows(
    session: Session, *, dataset: Dataset, rows: npt.NDArray[np.int64], column: str
) -> tuple[FloatArray, FloatArray, npt.NDArray[Any]]:
    """The rows ``rows`` (increasing indices) of ``dataset``: ``X``, ``y`` and the values of
    its extra column ``column``, in that order.

    Only the chunks that hold some of the rows are fetched, one at a time, so memory holds the
    rows asked for and one chunk, whatever the dataset's size.
    """
    types = _check_column_names(dataset, [column])
    sizes = session.execute(
        select(DatasetChunk.position, DatasetChunk.n_rows)
        .where(DatasetChunk.dataset_id == dataset.id)
        .order_by(DatasetChunk.position)
    ).all()
    positions = np.array([position for position, _ in sizes], dtype=np.int64)
    ends = np.cumsum([n_rows for _, n_rows in sizes], dtype=np.int64)
    if rows.size and (rows[0] < 0 or rows[-1] >= (ends[-1] if ends.size else 0)):
        raise ValueError(f"dataset {dataset.id} has no row {int(rows[-1])}")
    # Rows [cuts[i], cuts[i + 1]) of ``rows`` lie in chunk i.
    cuts = np.searchsorted(rows, np.concatenate(([0], ends)))
    needed = np.flatnonzero(np.diff(cuts) > 0)
    X = np.empty((rows.size, dataset.n_features), dtype=np.float64)
    y = np.empty(rows.size, dtype=np.float64)
    values = np.empty(rows.size, dtype=np.float64 if types[column] == NUMBER else object)
    chunks = session.execute(
        select(
            DatasetChunk.n_rows, DatasetChunk.x_data, DatasetChunk.y_data, DatasetChunk.extra_data
        )
        .where(
            DatasetChunk.dataset_id == dataset.id,
            DatasetChunk.position.in_(positions[needed].tolist()),
        )
        .order_by(DatasetChunk.position),
        execution_options={"yield_per": 1},
    )
    for (n_rows, x_data, y_data, extra_data), index in zip(chunks, needed, strict=True):
        first, stop = cuts[index], cuts[index + 1]
        mine = rows[first:stop] - (ends[index] - n_rows)
        X[first:stop] = decode_matrix(bytes(x_data), n_rows, dataset.n_features)[mine]
        y[first:stop] = decode_vector(bytes(y_data), n_rows)[mine]
        if extra_data is None:
            raise ValueError(f"dataset {dataset.id} has a chunk without its extra columns")
        values[first:stop] = decode_columns(bytes(extra_data), n_rows, [column], types)[column][
            mine
        ]
    return X, y, values


def load_dataset_arrays(dataset: Dataset) -> tuple[FloatArray, FloatArray]:
    """Decode the stored ``(X, y)`` arrays of ``dataset``, read through its session."""
    session = object_session(dataset)
    if session is None:
        raise ValueError(f"dataset {dataset.id} is not attached to a session")
    X = np.empty((dataset.n_rows, dataset.n_features), dtype=np.float64)
    y = np.empty(dataset.n_rows, dtype=np.float64)
    start = 0
    for X_block, y_block in iter_dataset_blocks(session, dataset=dataset):
        stop = min(start + len(y_block), dataset.n_rows)
        X[start:stop] = X_block[: stop - start]
        y[start:stop] = y_block[: stop - start]
        start += len(y_block)
    return X, y


def _check_column_names(dataset: Dataset, names: Sequence[str]) -> dict[str, str]:
    types = _column_types(dataset)
    missing = [name for name in names if name not in types]
    if missing:
        raise KeyError(
            f"dataset {dataset.id} has no extra column {missing[0]!r}; it has {list(types)}"
        )
    return types


def iter_dataset_columns(
    session: Session, *, dataset: Dataset, names: Sequence[str]
) -> Generator[dict[str, npt.NDArray[Any]], None, None]:
    """The values of the extra columns ``names`` of ``dataset``, chunk by chunk in row order:
    per chunk a dict name -> 1-D array (float64 for a ``number`` column, NaN where missing; an
    object array of ``str``, ``None`` where missing, for a ``string`` one).

    Only the chunks' extra data are fetched, one chunk at a time. Raises ``KeyError`` for a
    name the dataset does not keep, ``ValueError`` if the chunks do not add up to its rows.
    """
    types = _check_column_names(dataset, names)
    n_seen = 0
    # Closed when the generator is (a reader that stops early), not left to the collector:
    # on PostgreSQL the rows come from a server-side cursor.
    with session.execute(
        select(DatasetChunk.n_rows, DatasetChunk.extra_data)
        .where(DatasetChunk.dataset_id == dataset.id)
        .order_by(DatasetChunk.position),
        execution_options={"yield_per": 1},
    ) as rows:
        for n_rows, extra_data in rows:
            if extra_data is None:
                raise ValueError(f"dataset {dataset.id} has a chunk without its extra columns")
            yield decode_columns(bytes(extra_data), n_rows, names, types)
            n_seen += n_rows
    if n_seen != dataset.n_rows:
        raise ValueError(
            f"dataset {dataset.id} has {dataset.n_rows} rows but its chunks hold {n_seen}"
        )


def load_dataset_columns(dataset: Dataset, names: Sequence[str]) -> dict[str, npt.NDArray[Any]]:
    """Decode the whole extra columns ``names`` of ``dataset`` (read through its session), as
    :func:`iter_dataset_columns` gives them chunk by chunk."""
    session = object_session(dataset)
    if session is None:
        raise ValueError(f"dataset {dataset.id} is not attached to a session")
    types = _check_column_names(dataset, names)
    if not names:
        return {}
    loaded = {
        name: np.empty(dataset.n_rows, dtype=np.float64 if types[name] == NUMBER else object)
        for name in names
    }
    start = 0
    for block in iter_dataset_columns(session, dataset=dataset, names=names):
        count = len(next(iter(block.values()))) if block else 0
        for name, values in block.items():
            loaded[name][start : start + count] = values
        start += count
    return loaded


def _idempotency_scope(api_key_id: str | None) -> str:
    """The scope within which a caller's Idempotency-Keys are unique: its API key."""
    return api_key_id if api_key_id is not None else IDEMPOTENCY_SCOPE_WITHOUT_KEY


def get_dataset_by_idempotency_key(
    session: Session, *, api_key_id: str | None, key: str
) -> Dataset | None:
    """The dataset the caller ``api_key_id`` (None: without a key) uploaded with
    ``Idempotency-Key: key``, if any."""
    query = select(Dataset).where(
        Dataset.idempotency_scope == _idempotency_scope(api_key_id),
        Dataset.idempotency_key == key,
    )
    return session.scalars(query).one_or_none()


def set_dataset_idempotency_key(
    session: Session, *, dataset: Dataset, api_key_id: str | None, key: str, request_hash: str
) -> None:
    """Record the ``Idempotency-Key`` the caller ``api_key_id`` sent with an upload; a key
    that caller used before fails the flush with an ``IntegrityError``."""
    dataset.idempotency_scope = _idempotency_scope(api_key_id)
    dataset.idempotency_key = key
    dataset.request_hash = request_hash
    session.flush()


def list_datasets(
    session: Session, *, limit: int, offset: int, after: PageKey | None = None
) -> tuple[list[Dataset], int]:
    """Return a page of datasets, newest first (after the row ``after``), and the total count
    (stored ones only: a dataset still being uploaded has no rows yet)."""
    query = select(Dataset).where(Dataset.n_rows > 0)
    return _newest_first(session, query, Dataset, limit=limit, offset=offset, after=after)


_UNFINISHED = ("queued", "running")


def lock_dataset(session: Session, *, dataset_id: str, shared: bool) -> Dataset | None:
    """The dataset with this id, locked until the transaction ends (``shared``: against its
    deletion only, as a fit that is being queued does; else exclusively); None if none.

    On SQLite the lock compiles to nothing: ``BEGIN IMMEDIATE`` already serializes writers.
    """
    if not _is_id(dataset_id):
        return None
    return session.scalars(
        select(Dataset)
        .where(Dataset.id == dataset_id)
        .with_for_update(read=shared)
        .execution_options(populate_existing=True)
    ).first()


def unfinished_jobs_of_dataset(session: Session, *, dataset_id: str) -> list[str]:
    """Ids of the queued or running jobs that fit ``dataset_id``, oldest first."""
    return list(
        session.scalars(
            select(Job.id)
            .where(Job.dataset_id == dataset_id, Job.status.in_(_UNFINISHED))
            .order_by(Job.created_at, Job.id)
        )
    )


def delete_dataset(session: Session, *, dataset_id: str) -> bool:
    """Delete a dataset and its chunks (by the foreign key's cascade); False if there was none.

    Jobs and models keep its id as provenance. The caller checks that no unfinished job uses
    it (:func:`unfinished_jobs_of_dataset`, under :func:`lock_dataset`).
    """
    if not _is_id(dataset_id):
        return False
    deleted = _execute_counting(session, delete(Dataset).where(Dataset.id == dataset_id)) == 1
    cached = session.identity_map.get(Session.identity_key(Dataset, dataset_id))
    if cached is not None:
        session.expunge(cached)
    return deleted


def discard_job_data(session: Session, *, job_id: str) -> bool:
    """Delete the dataset of the finished job ``job_id`` if the job asked for it
    (``discard_data``) and no unfinished job uses it; True if it was deleted."""
    job = session.get(Job, job_id)
    if job is None or not job.discard_data or job.status not in TERMINAL_JOB_STATUSES:
        return False
    if lock_dataset(session, dataset_id=job.dataset_id, shared=False) is None:
        return False
    if unfinished_jobs_of_dataset(session, dataset_id=job.dataset_id):
        return False
    return delete_dataset(session, dataset_id=job.dataset_id)


def discard_finished_job_data(session: Session) -> list[str]:
    """Delete the datasets of finished jobs that asked for it (``discard_data``) and that no
    unfinished job uses; return their ids."""
    unfinished = select(Job.dataset_id).where(Job.status.in_(_UNFINISHED))
    doomed = list(
        session.scalars(
            select(Dataset.id)
            .where(
                Dataset.id.in_(
                    select(Job.dataset_id).where(
                        Job.discard_data.is_(True), Job.status.in_(TERMINAL_JOB_STATUSES)
                    )
                ),
                Dataset.id.not_in(unfinished),
            )
            .with_for_update(skip_locked=True)
        )
    )
    return [dataset_id for dataset_id in doomed if delete_dataset(session, dataset_id=dataset_id)]


def delete_unreferenced_datasets(session: Session, *, created_before: datetime) -> list[str]:
    """Delete the datasets created before ``created_before`` that no unfinished job uses and
    no stored model was fitted on; return their ids."""
    doomed = list(
        session.scalars(
            select(Dataset.id)
            .where(
                Dataset.created_at < created_before,
                Dataset.id.not_in(select(Job.dataset_id).where(Job.status.in_(_UNFINISHED))),
                Dataset.id.not_in(select(Model.dataset_id)),
            )
            .with_for_update(skip_locked=True)
        )
    )
    return [dataset_id for dataset_id in doomed if delete_dataset(session, dataset_id=dataset_id)]


def delete_finished_jobs(session: Session, *, finished_before: datetime) -> int:
    """Delete the jobs that finished before ``finished_before``; return how many. Their models
    stay (with no job)."""
    return _execute_counting(
        session,
        delete(Job).where(Job.status.in_(TERMINAL_JOB_STATUSES), Job.finished_at < finished_before),
    )


# Jobs -------------------------------------------------------------------------------------------


def create_job(
    session: Session,
    *,
    dataset_id: str,
    algorithm: str,
    n_components: int,
    params: Mapping[str, Any],
    fit_intercept: bool,
    holdout_fraction: float,
    max_attempts: int,
    seed: int | None = None,
    time_budget_s: float | None = None,
    name: str | None = None,
    api_key_id: str | None = None,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    k_values: Sequence[int] | None = None,
    registered_model: str | None = None,
    discard_data: bool = False,
    weights_column: str | None = None,
    groups_column: str | None = None,
    uncertainty: Mapping[str, Any] | None = None,
    gating: str | Sequence[str] | None = None,
    split_by: str | None = None,
    small_keys: str | None = None,
    keys_per_shard: int | None = None,
) -> Job:
    """Queue a fit of ``dataset_id``; ``params`` are the validated algorithm parameters.

    ``k_values`` makes the job a k sweep (one model per k); ``n_components`` is then the
    largest of them. ``api_key_id`` is the key that submitted it (None without keys); an
    ``idempotency_key`` is unique among that caller's jobs. ``registered_model`` names the
    registered model whose next version the fit becomes.
    ``discard_data`` deletes the dataset once the job is finished. ``weights_column`` and
    ``groups_column`` name the dataset columns of the row weights and group labels.
    ``uncertainty`` holds the
    standard errors and bootstrap the fit computes (``standard_errors``, ``n_bootstrap``,
    ``bootstrap``).
    ``gating`` asks for a gate: ``"features"`` or the names of the dataset's extra columns it
    reads.
    ``split_by`` makes it a
    keyed fit (a mixture per value of that dataset column); ``small_keys`` says what keys too
    small for k lines get.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    job = Job(
        id=_new_id(),
        status="queued",
        dataset_id=dataset_id,
        name=name,
        algorithm=algorithm,
        n_components=n_components,
        k_values=None if k_values is None else [int(k) for k in k_values],
        params=to_json_value(dict(params)),
        fit_intercept=fit_intercept,
        holdout_fraction=holdout_fraction,
        seed=seed,
        time_budget_s=time_budget_s,
        api_key_id=api_key_id,
        idempotency_scope=None if idempotency_key is None else _idempotency_scope(api_key_id),
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        attempts=0,
        max_attempts=max_attempts,
        cancel_requested=False,
        progress_fraction=0.0,
        created_at=utcnow(),
        warnings=[],
        registered_model=registered_model,
        discard_data=discard_data or None,
        weights_column=weights_column,
        groups_column=groups_column,
        uncertainty=None if uncertainty is None else to_json_value(dict(uncertainty)),
        gating=gating if gating is None or isinstance(gating, str) else list(gating),
        split_by=split_by,
        small_keys=small_keys,
        keys_per_shard=keys_per_shard,
    )
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, *, job_id: str) -> Job | None:
    """Return the job with this id, or None."""
    return session.get(Job, job_id) if _is_id(job_id) else None


def count_unfinished_jobs(session: Session, *, api_key_id: str | None) -> int:
    """Jobs queued or running that the API key ``api_key_id`` submitted (None: without a key)."""
    owner = Job.api_key_id.is_(None) if api_key_id is None else Job.api_key_id == api_key_id
    query = select(Job.id).where(Job.status.in_(("queued", "running")), owner)
    return _count(session, query)


def lock_job_quota(session: Session, *, api_key_id: str | None) -> None:
    """Hold, until the transaction ends, the lock under which the unfinished jobs of
    ``api_key_id`` are counted and a new one inserted, so that concurrent submissions cannot
    together exceed the quota.

    PostgreSQL: a transaction-level advisory lock per key. SQLite has one writer at a time: an
    empty write takes that lock (a no-op if the transaction already holds it).
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))"),
            {"name": f"mixreg-job-quota:{api_key_id or ''}"},
        )
    else:
        session.execute(update(Job).where(false()).values(status=Job.status))


def get_job_by_idempotency_key(session: Session, *, api_key_id: str | None, key: str) -> Job | None:
    """Return the job the caller ``api_key_id`` (None: without a key) created with this
    ``Idempotency-Key``, or None."""
    query = select(Job).where(
        Job.idempotency_scope == _idempotency_scope(api_key_id), Job.idempotency_key == key
    )
    return session.scalars(query).one_or_none()


def list_jobs(
    session: Session,
    *,
    status: str | None,
    limit: int,
    offset: int,
    after: PageKey | None = None,
) -> tuple[list[Job], int]:
    """Return a page of jobs (optionally only those in ``status``), newest first (after the
    row ``after``), and the total."""
    query = select(Job)
    if status is not None:
        query = query.where(Job.status == status)
    return _newest_first(session, query, Job, limit=limit, offset=offset, after=after)


def claim_job(session: Session, *, job_id: str, worker_id: str, now: datetime) -> bool:
    """Move ``job_id`` from ``queued`` to ``running`` for ``worker_id``; False if it was not
    queued (already claimed, finished or cancelled), in which case no row changes.

    The claim is a conditional UPDATE on ``status = 'queued'`` checked by its row count, so of
    several processes racing for one job exactly one wins, whatever locks they hold.
    """
    return _update_job(
        session,
        job_id,
        Job.status == "queued",
        status="running",
        worker_id=worker_id,
        attempts=Job.attempts + 1,
        started_at=now,
        heartbeat_at=now,
    )


def any_queued_job(session: Session) -> bool:
    """Whether some job waits in the queue (a cheap look before :func:`claim_next_job`)."""
    return session.scalar(select(select(Job.id).where(Job.status == "queued").exists())) is True


def claim_next_job(session: Session, *, worker_id: str, now: datetime) -> Job | None:
    """Atomically move the oldest queued job to ``running`` for ``worker_id``; None if none.

    Each candidate is taken with :func:`claim_job`; a racer that loses it tries the next one.
    On PostgreSQL the candidate is also locked with ``FOR UPDATE SKIP LOCKED`` so racers pick
    different rows instead of queueing behind each other (on SQLite it compiles to nothing,
    and ``BEGIN IMMEDIATE`` already serializes the transactions).
    """
    lost: list[str] = []
    while True:
        candidate = select(Job.id).where(Job.status == "queued")
        if lost:
            candidate = candidate.where(Job.id.not_in(lost))
        candidate = (
            candidate.order_by(Job.created_at, Job.id).limit(1).with_for_update(skip_locked=True)
        )
        job_id = session.scalars(candidate).first()
        if job_id is None:
            return None
        if claim_job(session, job_id=job_id, worker_id=worker_id, now=now):
            return session.get(Job, job_id)
        lost.append(job_id)


def _owned_by(worker_id: str, attempt: int | None = None) -> tuple[ColumnElement[bool], ...]:
    owned = (Job.status == "running", Job.worker_id == worker_id)
    # A worker may claim a job again after the reaper took it away: only the current attempt
    # is the worker's own.
    return owned if attempt is None else (*owned, Job.attempts == attempt)


def database_now(session: Session) -> datetime:
    """The time by the database's clock (PostgreSQL: the server's; SQLite, a local file: this
    machine's), so that workers on several machines judge heartbeats by one clock."""
    if session.get_bind().dialect.name == "postgresql":
        now = session.scalar(text("SELECT statement_timestamp()"))
        assert isinstance(now, datetime)
        return now.astimezone(UTC)
    return utcnow()


def heartbeat(
    session: Session, *, job_id: str, worker_id: str, now: datetime, attempt: int | None = None
) -> bool:
    """Record that ``worker_id`` still runs ``job_id`` (in its attempt ``attempt``, if given);
    False if the job, or that attempt, is no longer its own."""
    return _update_job(session, job_id, *_owned_by(worker_id, attempt), heartbeat_at=now)


def update_progress(
    session: Session,
    *,
    job_id: str,
    worker_id: str,
    fraction: float,
    iteration: int | None,
    candidates: int | None,
    best_loss: float | None,
    now: datetime,
    n_components: int | None = None,
    attempt: int | None = None,
    keys_done: int | None = None,
    n_keys: int | None = None,
) -> bool:
    """Record progress (which also counts as a heartbeat); False if the job (or its attempt
    ``attempt``, if given) is not owned.

    ``n_components`` is the k being fitted (of a k sweep); a keyed fit counts ``keys_done`` of
    its ``n_keys`` keys.
    """
    keyed = {} if n_keys is None else {"keys_done": keys_done, "n_keys": n_keys}
    return _update_job(
        session,
        job_id,
        *_owned_by(worker_id, attempt),
        **keyed,
        progress_fraction=fraction,
        progress_iteration=iteration,
        progress_candidates=candidates,
        progress_best_loss=best_loss,
        progress_n_components=n_components,
        heartbeat_at=now,
    )


def request_cancel(session: Session, *, job_id: str, now: datetime | None = None) -> Job | None:
    """Cancel a job: a queued job is cancelled at once, a running one is flagged for its worker.

    One conditional statement does both, so no state change can slip in between a look at the
    job's status and the write (a requeue of the running job would otherwise lose the cancel).
    A finished job is returned unchanged; None if there is no such job.
    """
    if not _is_id(job_id):
        return None
    now = now or utcnow()
    queued = Job.status == "queued"
    _update_job(
        session,
        job_id,
        Job.status.in_(("queued", "running")),
        cancel_requested=True,
        status=case((queued, "cancelled"), else_=Job.status),
        finished_at=case((queued, literal(now, UTCDateTime())), else_=Job.finished_at),
    )
    return session.get(Job, job_id)


def finish_job(
    session: Session,
    *,
    job_id: str,
    worker_id: str,
    status: str,
    now: datetime,
    error: str | None = None,
    model_id: str | None = None,
    sweep: Mapping[str, Any] | None = None,
    warnings: Sequence[str] = (),
    attempt: int | None = None,
    best_loss: float | None = None,
) -> bool:
    """Move a running job owned by ``worker_id`` (in its attempt ``attempt``, if given) to a
    terminal ``status``.

    ``sweep`` is the result of a k sweep, ``warnings`` what the fit found poor, ``best_loss``
    the training min-loss of the model the job chose (its progress showed the search's until
    then). Returns False
    if the job was taken away meanwhile (requeued by the reaper, or claimed by another
    worker or again), in which case nothing is written.
    """
    if status not in TERMINAL_JOB_STATUSES:
        raise ValueError(f"status must be one of {TERMINAL_JOB_STATUSES}, got {status!r}")
    values: dict[str, Any] = {
        "status": status,
        "error": error,
        "model_id": model_id,
        "sweep": None if sweep is None else to_json_value(dict(sweep)),
        "warnings": [str(warning) for warning in warnings],
        "finished_at": now,
    }
    if status == "succeeded":
        values["progress_fraction"] = 1.0
    if best_loss is not None:
        values["progress_best_loss"] = best_loss
    return _update_job(session, job_id, *_owned_by(worker_id, attempt), **values)


# A job handed back to the queue: no owner, no run in progress.
_BACK_IN_QUEUE: dict[str, Any] = {
    "status": "queued",
    "worker_id": None,
    "heartbeat_at": None,
    "started_at": None,
    "progress_fraction": 0.0,
    "progress_iteration": None,
    "progress_candidates": None,
    "progress_best_loss": None,
    "progress_n_components": None,
}


@dataclass(frozen=True)
class _StaleJob:
    job_id: str
    heartbeat_at: datetime
    attempts: int
    max_attempts: int
    cancel_requested: bool


def _stale_running_jobs(
    session: Session,
    *,
    stale_before: datetime,
    job_id: str | None = None,
    alive: Sequence[str] = (),
) -> list[_StaleJob]:
    """Running jobs (or just ``job_id``) whose heartbeat is older than ``stale_before``, but
    for those in ``alive``, locked, oldest first; on PostgreSQL rows another recoverer holds
    are skipped."""
    query = select(
        Job.id, Job.heartbeat_at, Job.attempts, Job.max_attempts, Job.cancel_requested
    ).where(Job.status == "running", Job.heartbeat_at < stale_before)
    if job_id is not None:
        query = query.where(Job.id == job_id)
    if alive:
        query = query.where(Job.id.not_in(list(alive)))
    rows = session.execute(
        query.order_by(Job.created_at, Job.id).with_for_update(skip_locked=True)
    ).all()
    stale: list[_StaleJob] = []
    for row_id, heartbeat_at, attempts, max_attempts, cancel_requested in rows:
        assert heartbeat_at is not None  # selected by heartbeat_at < stale_before
        stale.append(_StaleJob(row_id, heartbeat_at, attempts, max_attempts, cancel_requested))
    return stale


def _recover_stale(session: Session, job: _StaleJob, *, now: datetime) -> str | None:
    """Recover one running job whose heartbeat went stale: back to the queue with attempts
    left, failed "worker lost" without, cancelled if that was requested.

    Conditional on the heartbeat read, so a worker that beat in between keeps its job. Returns
    the job's new status, or None if it was not changed.
    """
    still_stale = (Job.status == "running", Job.heartbeat_at == job.heartbeat_at)
    values: dict[str, Any]
    if job.cancel_requested:
        values = {"status": "cancelled", "finished_at": now}
    elif job.attempts < job.max_attempts:
        # A cancel requested since the read above wins: the flag is looked at in the statement.
        values = {
            **_BACK_IN_QUEUE,
            "status": case((Job.cancel_requested, "cancelled"), else_="queued"),
            "finished_at": case((Job.cancel_requested, literal(now, UTCDateTime())), else_=None),
        }
    else:
        values = {
            "status": "failed",
            "finished_at": now,
            "error": (
                f"worker lost: no heartbeat since {job.heartbeat_at.isoformat()}; "
                f"gave up after {job.attempts} attempts"
            ),
        }
    if not _update_job(session, job.job_id, *still_stale, **values):
        return None
    return session.scalar(select(Job.status).where(Job.id == job.job_id))


def requeue_stale_jobs(
    session: Session, *, stale_before: datetime, now: datetime, alive: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """Recover running jobs whose last heartbeat is older than ``stale_before``, but for the
    jobs in ``alive`` (the caller's own fits, whose processes it sees running).

    A job with attempts left goes back to the queue; one that used all its attempts fails with
    a "worker lost" error; one whose cancellation was requested is cancelled. Returns the ids
    of the requeued and of the failed jobs.
    """
    requeued: list[str] = []
    failed: list[str] = []
    for job in _stale_running_jobs(session, stale_before=stale_before, alive=alive):
        status = _recover_stale(session, job, now=now)
        if status == "queued":
            requeued.append(job.job_id)
        elif status == "failed":
            failed.append(job.job_id)
    return requeued, failed


def recover_stale_job(
    session: Session, *, job_id: str, stale_before: datetime, now: datetime
) -> str | None:
    """Recover ``job_id`` as :func:`requeue_stale_jobs` would, if it is a running job whose
    heartbeat is older than ``stale_before``; return its new status, or None if unchanged."""
    if not _is_id(job_id):
        return None
    stale = _stale_running_jobs(session, stale_before=stale_before, job_id=job_id)
    return _recover_stale(session, stale[0], now=now) if stale else None


def release_job(session: Session, *, job_id: str, worker_id: str, now: datetime) -> str | None:
    """Hand back ``job_id``, run by ``worker_id``, which is shutting down cleanly.

    The job returns to the queue at once, and the attempt it was on is not counted: the
    worker stopped it on purpose. A job whose cancellation was requested is cancelled instead.
    Returns the job's new status (``queued`` or ``cancelled``), or None if the job was not
    running for ``worker_id``.
    """
    owned = session.execute(
        select(Job.cancel_requested)
        .where(Job.id == job_id, *_owned_by(worker_id))
        .with_for_update()
    ).first()
    if owned is None:
        return None
    if owned.cancel_requested:
        values: dict[str, Any] = {"status": "cancelled", "finished_at": now}
    else:
        values = {"attempts": Job.attempts - 1, **_BACK_IN_QUEUE}
    if not _update_job(session, job_id, *_owned_by(worker_id), **values):
        return None
    return str(values["status"])


def release_jobs(session: Session, *, worker_id: str, now: datetime) -> list[str]:
    """Hand back every running job of ``worker_id`` (see :func:`release_job`).

    Returns the ids of the requeued jobs.
    """
    owned = session.scalars(
        select(Job.id).where(*_owned_by(worker_id)).order_by(Job.created_at, Job.id)
    ).all()
    return [
        job_id
        for job_id in owned
        if release_job(session, job_id=job_id, worker_id=worker_id, now=now) == "queued"
    ]


def set_task_id(session: Session, *, job_id: str, task_id: int) -> None:
    """Record the Procrastinate job that carries ``job_id``."""
    _update_job(session, job_id, task_id=task_id)


def queued_jobs_without_task(session: Session) -> list[str]:
    """Ids of queued jobs that no Procrastinate job carries (queued by an embedded-mode
    process), oldest first."""
    return list(
        session.scalars(
            select(Job.id)
            .where(Job.status == "queued", Job.task_id.is_(None))
            .order_by(Job.created_at, Job.id)
            .with_for_update(skip_locked=True)
        )
    )


def task_queue_summary(
    session: Session, *, queue: str, stale_after_s: float
) -> tuple[int, int] | None:
    """Procrastinate's view of ``queue`` (PostgreSQL): the workers whose heartbeat is younger
    than ``stale_after_s`` and the tasks waiting; None if its schema is not installed."""
    if session.scalar(text("SELECT to_regclass('procrastinate_jobs')")) is None:
        return None
    workers = session.scalar(
        text(
            "SELECT count(*) FROM procrastinate_workers "
            "WHERE last_heartbeat > now() - make_interval(secs => :seconds)"
        ),
        {"seconds": stale_after_s},
    )
    waiting = session.scalar(
        text(
            "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = :queue AND status = 'todo'"
        ),
        {"queue": queue},
    )
    return int(workers or 0), int(waiting or 0)


def count_jobs_by_status(session: Session) -> dict[str, int]:
    """How many jobs are in each state (states with no job are left out)."""
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
    return {status: count for status, count in rows}


def jobs_with_cancel_requested(session: Session, *, worker_id: str) -> list[str]:
    """Return the ids of running jobs of ``worker_id`` whose cancellation was requested."""
    return list(
        session.scalars(
            select(Job.id)
            .where(
                Job.status == "running",
                Job.worker_id == worker_id,
                Job.cancel_requested.is_(True),
            )
            .order_by(Job.created_at, Job.id)
        )
    )


# Models -----------------------------------------------------------------------------------------


def create_model(
    session: Session,
    *,
    job_id: str | None,
    dataset_id: str,
    name: str | None,
    algorithm: str,
    n_components: int,
    n_features: int,
    feature_names: Sequence[str],
    fit_intercept: bool,
    params: Mapping[str, Any],
    seed: int | None,
    coef: npt.ArrayLike,
    intercept: npt.ArrayLike,
    shares: npt.ArrayLike,
    train_min_loss: float,
    holdout_min_loss: float | None,
    baseline: Mapping[str, Any],
    n_train: int,
    n_holdout: int,
    loss_history: npt.ArrayLike,
    n_iter: int,
    fit_seconds: float,
    converged: bool | None = None,
    log_likelihood: float | None = None,
    bic: float | None = None,
    n_parameters: int | None = None,
    candidates: Sequence[Mapping[str, Any]] | None = None,
    warnings: Sequence[str] = (),
    weights_column: str | None = None,
    groups_column: str | None = None,
    group_labels: npt.ArrayLike | None = None,
    group_lines: npt.ArrayLike | None = None,
    group_posteriors: npt.ArrayLike | None = None,
    group_metrics: Mapping[str, Any] | None = None,
    uncertainty: Mapping[str, Any] | None = None,
    gate: Mapping[str, Any] | None = None,
    split_by: str | None = None,
    keyed_summary: Mapping[str, Any] | None = None,
) -> Model:
    """Store a fitted model; arrays are kept as JSON lists of exactly the same float64 values.

    ``coef`` has shape (n_components, n_features); ``intercept`` and ``shares`` have shape
    (n_components,). ``log_likelihood``, ``bic`` and ``n_parameters`` score the lines as a
    Gaussian mixture on the training rows; ``candidates`` is the search record of ``auto``;
    ``uncertainty`` the table of estimates with their standard errors and intervals.
    A grouped fit gives ``group_labels`` (its training groups), ``group_lines`` (the line of
    each) and, for EM, ``group_posteriors`` (each group's posterior over the lines), stored
    compactly (``codecs.encode_group_table``), and its ``group_metrics``.
    ``gate`` the fitted gate of a gated mixture (JSON numbers).
    """
    coef_array = np.asarray(coef, dtype=np.float64)
    intercept_array = np.asarray(intercept, dtype=np.float64)
    shares_array = np.asarray(shares, dtype=np.float64)
    if coef_array.shape != (n_components, n_features):
        raise ValueError(
            f"coef must have shape ({n_components}, {n_features}), got {coef_array.shape}"
        )
    for label, array in (("intercept", intercept_array), ("shares", shares_array)):
        if array.shape != (n_components,):
            raise ValueError(f"{label} must have shape ({n_components},), got {array.shape}")
    if len(feature_names) != n_features:
        raise ValueError(f"got {len(feature_names)} feature names for {n_features} features")
    model = Model(
        id=_new_id(),
        job_id=job_id,
        dataset_id=dataset_id,
        name=name,
        algorithm=algorithm,
        n_components=n_components,
        n_features=n_features,
        feature_names=list(feature_names),
        fit_intercept=fit_intercept,
        params=to_json_value(dict(params)),
        seed=seed,
        coef=to_json_value(coef_array),
        intercept=to_json_value(intercept_array),
        shares=to_json_value(shares_array),
        train_min_loss=float(train_min_loss),
        holdout_min_loss=None if holdout_min_loss is None else float(holdout_min_loss),
        baseline=to_json_value(dict(baseline)),
        n_train=n_train,
        n_holdout=n_holdout,
        loss_history=to_json_value(np.asarray(loss_history, dtype=np.float64).ravel()),
        n_iter=n_iter,
        fit_seconds=float(fit_seconds),
        created_at=utcnow(),
        converged=converged,
        log_likelihood=None if log_likelihood is None else float(log_likelihood),
        bic=None if bic is None else float(bic),
        n_parameters=n_parameters,
        candidates=(
            None if candidates is None else to_json_value([dict(item) for item in candidates])
        ),
        warnings=[str(warning) for warning in warnings],
        weights_column=weights_column,
        groups_column=groups_column,
        group_table=(
            None
            if group_labels is None or group_lines is None
            else encode_group_table(group_labels, group_lines, group_posteriors)
        ),
        group_metrics=None if group_metrics is None else to_json_value(dict(group_metrics)),
        uncertainty=None if uncertainty is None else to_json_value(dict(uncertainty)),
        gate=None if gate is None else to_json_value(dict(gate)),
        split_by=split_by,
        keyed_summary=None if keyed_summary is None else to_json_value(dict(keyed_summary)),
    )
    session.add(model)
    session.flush()
    return model


def get_model(session: Session, *, model_id: str) -> Model | None:
    """Return the model with this id, or None."""
    return session.get(Model, model_id) if _is_id(model_id) else None


def list_models(
    session: Session, *, limit: int, offset: int, after: PageKey | None = None
) -> tuple[list[Model], int]:
    """Return a page of models, newest first (after the row ``after``), and the total."""
    return _newest_first(session, select(Model), Model, limit=limit, offset=offset, after=after)


def existing_model_ids(session: Session, *, model_ids: Iterable[str]) -> set[str]:
    """The ids among ``model_ids`` whose model still exists."""
    wanted = [model_id for model_id in model_ids if _is_id(model_id)]
    if not wanted:
        return set()
    return set(session.scalars(select(Model.id).where(Model.id.in_(wanted))))


def delete_model(session: Session, *, model_id: str) -> bool:
    """Delete a model; False if there was none. Jobs keep their (now dangling) model id."""
    if not _is_id(model_id):
        return False
    deleted = _execute_counting(session, delete(Model).where(Model.id == model_id)) == 1
    cached = session.identity_map.get(Session.identity_key(Model, model_id))
    if cached is not None:
        session.expunge(cached)
    return deleted


def load_group_table(session: Session, *, model_id: str) -> GroupTable | None:
    """A grouped model's group labels, line of each (and posteriors, for EM), or None for a
    model without groups."""
    stored = session.scalar(select(Model.group_table).where(Model.id == model_id))
    return None if stored is None else decode_group_table(stored)


def record_keyed_summary(session: Session, *, job_id: str, summary: Mapping[str, Any]) -> None:
    """Record a keyed job's per-key counts, failures and min-loss quantiles; every key done."""
    n_keys = int(summary.get("n_keys", 0))
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(keyed_summary=to_json_value(dict(summary)), keys_done=n_keys, n_keys=n_keys)
    )


def load_keyed_arrays(session: Session, *, model_id: str) -> dict[str, npt.NDArray[Any]]:
    """Every chunk of the keyed model ``model_id`` joined in key order: name -> array."""
    parts: dict[str, list[npt.NDArray[Any]]] = {}
    rows = session.execute(
        select(KeyedModelChunk.data)
        .where(KeyedModelChunk.model_id == model_id)
        .order_by(KeyedModelChunk.position),
        execution_options={"yield_per": 1},
    )
    for (data,) in rows:
        for name, array in decode_arrays(bytes(data)).items():
            parts.setdefault(name, []).append(_compact_text(array))
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def _compact_text(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Fixed-width text (keys stored before texts were stored as UTF-8) as Python strings:
    joined with other chunks, or kept in a cache, it is not padded to its longest key."""
    return array.astype(object) if array.dtype.kind == "U" else array


@dataclass(frozen=True)
class ShardClaim:
    """A shard of a keyed job claimed by one claimant: its position, keys and dataset rows."""

    position: int
    n_keys: int
    rows: npt.NDArray[np.int64]
    """The dataset rows of the shard's keys, in increasing order."""


def encode_rows(rows: npt.NDArray[np.int64]) -> bytes:
    """The increasing row indices ``rows`` as ``.npz``: runs of consecutive rows (starts and
    lengths) when that is smaller, as when the rows of a key are next to each other, else
    the rows themselves (32 bits each when they fit)."""
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    if 2 * (breaks.size + 1) < rows.size:
        edges = np.concatenate(([0], breaks, [rows.size]))
        return encode_arrays({"starts": rows[edges[:-1]], "lengths": np.diff(edges)})
    small = rows.size == 0 or int(rows[-1]) < np.iinfo(np.int32).max
    return encode_arrays({"rows": rows.astype(np.int32 if small else np.int64)})


def decode_rows(data: bytes) -> npt.NDArray[np.int64]:
    """The row indices that :func:`encode_rows` encoded."""
    arrays = decode_arrays(data)
    if "rows" in arrays:
        rows: npt.NDArray[np.int64] = arrays["rows"].astype(np.int64)
        return rows
    starts, lengths = arrays["starts"].astype(np.int64), arrays["lengths"].astype(np.int64)
    firsts = np.cumsum(lengths) - lengths
    expanded: npt.NDArray[np.int64] = np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(
        starts - firsts, lengths
    )
    return expanded


def plan_job_shards(
    session: Session, *, job_id: str, shards: Sequence[tuple[int, npt.NDArray[np.int64]]]
) -> bool:
    """Record the shards of the keyed job ``job_id`` (per shard its key count and the rows of
    its keys, increasing) as claims nobody holds, unless its plan exists already (an earlier
    attempt made it: the plan of a job never changes); a shard already stored is done. True if
    the plan was recorded by this call (False too for a job that is finished)."""
    status = session.scalar(select(Job.status).where(Job.id == job_id).with_for_update())
    if status not in _UNFINISHED:
        # Ended (cancelled, say) while its process read the keys: a plan would outlive it.
        return False
    if session.scalar(select(func.count()).where(KeyedJobShardClaim.job_id == job_id)):
        return False
    stored = set(stored_job_shards(session, job_id=job_id))
    for position, (n_keys, rows) in enumerate(shards):
        session.execute(
            insert(KeyedJobShardClaim).values(
                job_id=job_id,
                position=position,
                n_keys=n_keys,
                n_rows=len(rows),
                rows=encode_rows(np.asarray(rows, dtype=np.int64)),
                keys_done=0,
                done=position in stored,
            )
        )
    return True


_UNFINISHED = ("queued", "running")


def _job_unfinished(job_id: str) -> ColumnElement[bool]:
    """The job exists, is queued or running, and nobody asked to cancel it."""
    return (
        select(Job.id)
        .where(Job.id == job_id, Job.status.in_(_UNFINISHED), Job.cancel_requested.is_(False))
        .exists()
    )


def claim_job_shard(
    session: Session, *, job_id: str, claimant: str, now: datetime, stale_before: datetime
) -> ShardClaim | None:
    """Claim for ``claimant`` the first shard of the keyed job ``job_id`` that is not done and
    that nobody holds, or whose claimant's heartbeat is older than ``stale_before``; None if
    there is none (or the job is finished or being cancelled). Rows other transactions hold
    are skipped (``FOR UPDATE SKIP LOCKED``), so claimants never wait for one another."""
    row = session.execute(
        select(KeyedJobShardClaim.position, KeyedJobShardClaim.n_keys, KeyedJobShardClaim.rows)
        .where(
            KeyedJobShardClaim.job_id == job_id,
            KeyedJobShardClaim.done.is_(False),
            or_(
                KeyedJobShardClaim.claimed_by.is_(None),
                KeyedJobShardClaim.heartbeat_at < stale_before,
            ),
            _job_unfinished(job_id),
        )
        .order_by(KeyedJobShardClaim.position)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).first()
    if row is None:
        return None
    position, n_keys, rows = row
    session.execute(
        update(KeyedJobShardClaim)
        .where(KeyedJobShardClaim.job_id == job_id, KeyedJobShardClaim.position == position)
        .values(claimed_by=claimant, heartbeat_at=now, keys_done=0)
    )
    return ShardClaim(position=position, n_keys=n_keys, rows=decode_rows(bytes(rows)))


def beat_job_shards(
    session: Session, *, job_id: str, claimant: str, now: datetime, keys_done: int | None = None
) -> bool:
    """Renew the heartbeat of the shards of ``job_id`` that ``claimant`` holds (and record
    the keys it has fitted of them); False if the job is finished or being cancelled, when
    its shards' work should stop."""
    values: dict[str, Any] = {"heartbeat_at": now}
    if keys_done is not None:
        values["keys_done"] = keys_done
    session.execute(
        update(KeyedJobShardClaim)
        .where(
            KeyedJobShardClaim.job_id == job_id,
            KeyedJobShardClaim.claimed_by == claimant,
            KeyedJobShardClaim.done.is_(False),
        )
        .values(**values)
    )
    return bool(session.scalar(select(_job_unfinished(job_id))))


@dataclass(frozen=True)
class ShardCounts:
    """Where a keyed job's shards stand."""

    n_shards: int
    done: int
    keys_done: int
    """Keys of the stored shards plus those fitted so far in the claimed ones."""
    claimable: int
    """Shards not done that nobody holds (stale claims not counted)."""


def job_shard_counts(session: Session, *, job_id: str) -> ShardCounts:
    """How many shards the keyed job ``job_id`` has, are done and are free, and its keys done."""
    n_shards, done, keys_done, claimable = session.execute(
        select(
            func.count(),
            func.count().filter(KeyedJobShardClaim.done.is_(True)),
            func.coalesce(
                func.sum(
                    case(
                        (KeyedJobShardClaim.done.is_(True), KeyedJobShardClaim.n_keys),
                        else_=KeyedJobShardClaim.keys_done,
                    )
                ),
                0,
            ),
            func.count().filter(
                KeyedJobShardClaim.done.is_(False), KeyedJobShardClaim.claimed_by.is_(None)
            ),
        ).where(KeyedJobShardClaim.job_id == job_id)
    ).one()
    return ShardCounts(int(n_shards), int(done), int(keys_done), int(claimable))


def store_job_shard(
    session: Session,
    *,
    job_id: str,
    position: int,
    claimant: str,
    worker_id: str,
    arrays: Mapping[str, npt.ArrayLike],
) -> bool:
    """Store the fitted shard ``position`` of the keyed job ``job_id`` and mark it done, if
    ``claimant`` still holds it and the job is unfinished; False, storing nothing, otherwise
    (its claim went stale and another claimant took it, or the job ended): a shard is stored
    once. ``worker_id`` is recorded as the worker that fitted it, with the job's attempt."""
    encoded = _encode_keyed_chunk(arrays)
    # Shares the job's row lock with the statement that ends the job (it deletes the job's
    # shards): on PostgreSQL that statement waits for this shard, or this call sees the job
    # ended, so no shard is left behind by a job that ended meanwhile.
    session.execute(select(Job.id).where(Job.id == job_id).with_for_update(read=True))
    marked = _execute_counting(
        session,
        update(KeyedJobShardClaim)
        .where(
            KeyedJobShardClaim.job_id == job_id,
            KeyedJobShardClaim.position == position,
            KeyedJobShardClaim.claimed_by == claimant,
            KeyedJobShardClaim.done.is_(False),
            _job_unfinished(job_id),
        )
        .values(done=True, keys_done=KeyedJobShardClaim.n_keys),
    )
    if marked != 1:
        return False
    attempt = session.scalar(select(Job.attempts).where(Job.id == job_id))
    session.execute(
        insert(KeyedJobShard).values(
            job_id=job_id,
            position=position,
            n_keys=len(np.asarray(arrays["keys"])),
            fitted_attempt=attempt,
            fitted_by=worker_id,
            data=encoded,
        )
    )
    return True


def _encode_keyed_chunk(arrays: Mapping[str, npt.ArrayLike]) -> bytes:
    """The stored bytes of consecutive keys and their lines (``KeyedModelChunk.data``); text
    keys (fixed-width or an object array of ``str``) are stored as UTF-8 bytes and offsets."""
    return encode_arrays(arrays)


def add_keyed_model_chunks(
    session: Session,
    *,
    model_id: str,
    arrays: Mapping[str, npt.NDArray[Any]],
    keys_per_chunk: int,
) -> int:
    """Store every key's lines of the keyed model ``model_id`` (the arrays of
    :func:`load_keyed_arrays`, keys sorted) as chunks of ``keys_per_chunk`` keys, as a keyed
    job stores them; the number of chunks."""
    n_keys = len(arrays["keys"])
    positions = range(0, n_keys, keys_per_chunk)
    for position, start in enumerate(positions):
        chunk = {name: values[start : start + keys_per_chunk] for name, values in arrays.items()}
        session.add(
            KeyedModelChunk(
                model_id=model_id,
                position=position,
                n_keys=len(chunk["keys"]),
                fitted_attempt=None,
                fitted_by=None,
                data=_encode_keyed_chunk(chunk),
            )
        )
    session.flush()
    return len(positions)


def _delete_shards_if_finished(session: Session, job_id: str) -> None:
    """Delete the stored shards and shard claims of ``job_id`` if the job is finished."""
    finished = (
        select(Job.id).where(Job.id == job_id, Job.status.in_(TERMINAL_JOB_STATUSES)).exists()
    )
    session.execute(delete(KeyedJobShard).where(KeyedJobShard.job_id == job_id, finished))
    session.execute(delete(KeyedJobShardClaim).where(KeyedJobShardClaim.job_id == job_id, finished))


def delete_finished_job_shards(session: Session) -> int:
    """Delete the stored shards and shard claims of every finished job (left by a version
    that kept them); return how many shards and claims were deleted."""
    finished = select(Job.id).where(Job.status.in_(TERMINAL_JOB_STATUSES))
    deleted = _execute_counting(
        session, delete(KeyedJobShard).where(KeyedJobShard.job_id.in_(finished))
    )
    return deleted + _execute_counting(
        session, delete(KeyedJobShardClaim).where(KeyedJobShardClaim.job_id.in_(finished))
    )


def stored_job_shards(session: Session, *, job_id: str) -> list[int]:
    """The positions of the shards the keyed job ``job_id`` has stored, in order."""
    return list(
        session.scalars(
            select(KeyedJobShard.position)
            .where(KeyedJobShard.job_id == job_id)
            .order_by(KeyedJobShard.position)
        )
    )


def load_job_shards(session: Session, *, job_id: str) -> dict[str, npt.NDArray[Any]]:
    """Every stored shard of the keyed job ``job_id`` joined in key order: name -> array."""
    parts: dict[str, list[npt.NDArray[Any]]] = {}
    rows = session.execute(
        select(KeyedJobShard.data)
        .where(KeyedJobShard.job_id == job_id)
        .order_by(KeyedJobShard.position),
        execution_options={"yield_per": 1},
    )
    for (data,) in rows:
        for name, array in decode_arrays(bytes(data)).items():
            parts.setdefault(name, []).append(_compact_text(array))
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def publish_job_shards(session: Session, *, job_id: str, model_id: str) -> None:
    """Make the keyed job's stored shards the chunks of its model ``model_id`` (in the
    database, nothing passes through Python) and delete them, and its shard claims, from the
    job."""
    session.execute(
        insert(KeyedModelChunk).from_select(
            ["model_id", "position", "n_keys", "fitted_attempt", "fitted_by", "data"],
            select(
                literal(model_id),
                KeyedJobShard.position,
                KeyedJobShard.n_keys,
                KeyedJobShard.fitted_attempt,
                KeyedJobShard.fitted_by,
                KeyedJobShard.data,
            ).where(KeyedJobShard.job_id == job_id),
        )
    )
    session.execute(delete(KeyedJobShard).where(KeyedJobShard.job_id == job_id))
    session.execute(delete(KeyedJobShardClaim).where(KeyedJobShardClaim.job_id == job_id))
