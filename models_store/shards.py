"""The SQL of a keyed job's shards (docs/adr/0027): planned once, claimed by one claimant at
a time (a stale claim is free again), heartbeated, stored once, counted, and published as the
chunks of the job's model.

Functions take the session first and everything else by keyword, flush but never commit
(:mod:`models_store.common`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    ColumnElement,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session

from models_store.codecs import (
    decode_arrays,
    encode_arrays,
)
from models_store.common import (
    UNFINISHED_JOB_STATUSES,
    encode_keyed_chunk,
    execute_counting,
    join_keyed_chunks,
)
from models_store.tables import (
    TERMINAL_JOB_STATUSES,
    Job,
    KeyedJobShard,
    KeyedJobShardClaim,
    KeyedModelChunk,
)


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
    if status not in UNFINISHED_JOB_STATUSES:
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


def _job_unfinished(job_id: str) -> ColumnElement[bool]:
    """The job exists, is queued or running, and nobody asked to cancel it."""
    return (
        select(Job.id)
        .where(
            Job.id == job_id,
            Job.status.in_(UNFINISHED_JOB_STATUSES),
            Job.cancel_requested.is_(False),
        )
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
    encoded = encode_keyed_chunk(arrays)
    # Shares the job's row lock with the statement that ends the job (it deletes the job's
    # shards): on PostgreSQL that statement waits for this shard, or this call sees the job
    # ended, so no shard is left behind by a job that ended meanwhile.
    session.execute(select(Job.id).where(Job.id == job_id).with_for_update(read=True))
    marked = execute_counting(
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


def delete_shards_if_finished(session: Session, job_id: str) -> None:
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
    deleted = execute_counting(
        session, delete(KeyedJobShard).where(KeyedJobShard.job_id.in_(finished))
    )
    return deleted + execute_counting(
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
    return join_keyed_chunks(
        session,
        select(KeyedJobShard.data)
        .where(KeyedJobShard.job_id == job_id)
        .order_by(KeyedJobShard.position),
    )


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
