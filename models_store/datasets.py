"""The SQL of datasets: stored in chunks of rows (docs/adr/0009), read back whole, by block,
by column or by row, listed, deduplicated by Idempotency-Key, locked and deleted.

Functions take the session first and everything else by keyword, flush but never commit
(:mod:`models_store.common`).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.orm import Session, object_session

from models_store.codecs import (
    COLUMN_TYPES,
    NUMBER,
    STRING,
    decode_columns,
    decode_matrix,
    decode_vector,
    encode_columns,
    encode_matrix,
    encode_vector,
)
from models_store.common import (
    UNFINISHED_JOB_STATUSES,
    FloatArray,
    PageKey,
    execute_counting,
    idempotency_scope,
    is_id,
    new_id,
    newest_first,
    utcnow,
)
from models_store.tables import (
    Dataset,
    DatasetChunk,
    Job,
    Model,
)

DATASET_CHUNK_BYTES = 8 * 1024 * 1024
"""About this many bytes of features per stored chunk (docs/adr/0009)."""


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
        id=new_id(),
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
    execute_counting(session, delete(Dataset).where(Dataset.id == dataset_id, Dataset.n_rows == 0))


def get_dataset(session: Session, *, dataset_id: str) -> Dataset | None:
    """Return the dataset with this id, or None (also while it is being stored)."""
    if not is_id(dataset_id):
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


def get_dataset_by_idempotency_key(
    session: Session, *, api_key_id: str | None, key: str
) -> Dataset | None:
    """The dataset the caller ``api_key_id`` (None: without a key) uploaded with
    ``Idempotency-Key: key``, if any."""
    query = select(Dataset).where(
        Dataset.idempotency_scope == idempotency_scope(api_key_id),
        Dataset.idempotency_key == key,
    )
    return session.scalars(query).one_or_none()


def set_dataset_idempotency_key(
    session: Session, *, dataset: Dataset, api_key_id: str | None, key: str, request_hash: str
) -> None:
    """Record the ``Idempotency-Key`` the caller ``api_key_id`` sent with an upload; a key
    that caller used before fails the flush with an ``IntegrityError``."""
    dataset.idempotency_scope = idempotency_scope(api_key_id)
    dataset.idempotency_key = key
    dataset.request_hash = request_hash
    session.flush()


def list_datasets(
    session: Session, *, limit: int, offset: int, after: PageKey | None = None
) -> tuple[list[Dataset], int]:
    """Return a page of datasets, newest first (after the row ``after``), and the total count
    (stored ones only: a dataset still being uploaded has no rows yet)."""
    query = select(Dataset).where(Dataset.n_rows > 0)
    return newest_first(session, query, Dataset, limit=limit, offset=offset, after=after)


def lock_dataset(session: Session, *, dataset_id: str, shared: bool) -> Dataset | None:
    """The dataset with this id, locked until the transaction ends (``shared``: against its
    deletion only, as a fit that is being queued does; else exclusively); None if none.

    On SQLite the lock compiles to nothing: ``BEGIN IMMEDIATE`` already serializes writers.
    """
    if not is_id(dataset_id):
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
            .where(Job.dataset_id == dataset_id, Job.status.in_(UNFINISHED_JOB_STATUSES))
            .order_by(Job.created_at, Job.id)
        )
    )


def delete_dataset(session: Session, *, dataset_id: str) -> bool:
    """Delete a dataset and its chunks (by the foreign key's cascade); False if there was none.

    Jobs and models keep its id as provenance. The caller checks that no unfinished job uses
    it (:func:`unfinished_jobs_of_dataset`, under :func:`lock_dataset`).
    """
    if not is_id(dataset_id):
        return False
    deleted = execute_counting(session, delete(Dataset).where(Dataset.id == dataset_id)) == 1
    cached = session.identity_map.get(Session.identity_key(Dataset, dataset_id))
    if cached is not None:
        session.expunge(cached)
    return deleted


def delete_unreferenced_datasets(session: Session, *, created_before: datetime) -> list[str]:
    """Delete the datasets created before ``created_before`` that no unfinished job uses and
    no stored model was fitted on; return their ids."""
    doomed = list(
        session.scalars(
            select(Dataset.id)
            .where(
                Dataset.created_at < created_before,
                Dataset.id.not_in(
                    select(Job.dataset_id).where(Job.status.in_(UNFINISHED_JOB_STATUSES))
                ),
                Dataset.id.not_in(select(Model.dataset_id)),
            )
            .with_for_update(skip_locked=True)
        )
    )
    return [dataset_id for dataset_id in doomed if delete_dataset(session, dataset_id=dataset_id)]
