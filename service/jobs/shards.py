"""Keyed fits: a mixture per key, in shards of consecutive keys planned once per job and
claimed, fitted and stored by any process of any worker (:class:`ShardStore`); a claim whose
heartbeat went stale is free again, so a lost worker loses at most one shard's work.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy.orm import Session, sessionmaker

import mixreg
from mixreg import service_support
from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store import shards as shard_store
from models_store.common import database_now
from models_store.session import read_scope, session_scope
from models_store.tables import TERMINAL_JOB_STATUSES, Job
from service.config import (
    DEFAULT_MAX_KEY_CHARS,
    DEFAULT_MAX_KEYED_COEFFICIENTS,
)
from service.jobs.fit_columns import (
    check_integer_keys,
)
from service.jobs.fit_spec import (
    FitSpec,
    FloatArray,
    IndexArray,
    ProgressCallback,
    TrainHoldout,
    holdout_size,
)
from service.jobs.fitting import FittedSweep, fit_split
from service.jobs.lease import FitCancelledError, JobLostError, Lease, exit_if_worker_gone

logger = logging.getLogger(__name__)


DEFAULT_KEYS_PER_SHARD = 65_536
"""Keys a keyed job fits and stores at a time: a lost worker loses at most this many."""


@dataclass(frozen=True)
class KeyedData:
    """A keyed fit's dataset, key column and settings."""

    dataset_id: str
    split_by: str
    small_keys: str
    keys_per_shard: int

    @classmethod
    def of_job(cls, job: Job) -> KeyedData:
        """The keyed settings of ``job`` (which has a ``split_by``)."""
        assert job.split_by is not None
        return cls(
            dataset_id=job.dataset_id,
            split_by=job.split_by,
            small_keys=job.small_keys or "k1",
            keys_per_shard=job.keys_per_shard or DEFAULT_KEYS_PER_SHARD,
        )


@dataclass(frozen=True)
class KeyedLimits:
    """What a keyed job may hold: keys of at most ``max_key_chars`` characters
    (``MIXREG_MAX_KEY_CHARS``), and at most ``max_coefficients`` lines' coefficients over
    every key, n_keys x k x features (``MIXREG_MAX_KEYED_COEFFICIENTS``)."""

    max_key_chars: int = DEFAULT_MAX_KEY_CHARS
    max_coefficients: int = DEFAULT_MAX_KEYED_COEFFICIENTS

    def check_coefficients(self, n_keys: int, n_components: int, n_features: int) -> None:
        """Raise ``ValueError`` naming the product past the limit."""
        product = n_keys * n_components * n_features
        if product > self.max_coefficients:
            raise ValueError(
                f"split_by: {n_keys:,} keys x k = {n_components} x {n_features} features make "
                f"{product:,} coefficients; a keyed fit may hold at most "
                f"{self.max_coefficients:,} (MIXREG_MAX_KEYED_COEFFICIENTS): split by a column "
                f"with fewer keys, or fit fewer lines or features"
            )


def key_values(values: NDArray[Any]) -> NDArray[Any]:
    """A key column's values (a number column: float with NaN where missing; text: str, None
    where missing) with an empty text as a missing key."""
    if values.dtype == object:
        values = values.copy()
        values[values == ""] = None
    return values


def keyed_global_sample(
    n_rows: int, holdout_fraction: float, seed: int, max_rows: int
) -> tuple[IndexArray, NDArray[np.bool_]]:
    """The rows a keyed job's global model is fitted and scored on: at most ``max_rows`` rows
    drawn at random (every row if there are no more), increasing, and which of them are held
    out.

    A row is held out exactly when it is in the job's holdout over all rows
    (:func:`holdout_split` of ``n_rows``). The sample is the first rows of each side of the
    split in that split's own random order, in proportion to the sides' sizes: a uniform
    random part of each side, drawn with no second permutation of the rows.
    """
    n_holdout = holdout_size(n_rows, holdout_fraction)
    # holdout_split's draw: its first n_holdout entries are the holdout.
    permutation = np.random.default_rng(seed).permutation(n_rows)
    if n_rows <= max_rows:
        held = np.zeros(n_rows, dtype=bool)
        held[permutation[:n_holdout]] = True
        return np.arange(n_rows, dtype=np.int64), held
    n_held = round(max_rows * n_holdout / n_rows)
    rows = np.concatenate(
        (permutation[:n_held], permutation[n_holdout : n_holdout + max_rows - n_held])
    )
    del permutation
    order = np.argsort(rows)
    return rows[order], order < n_held


class ShardStore:
    """A keyed job's shards seen by one claimant (a process of a worker): its plan, claims,
    stored shards and the progress of all of them.

    Used as a context manager: a daemon thread renews the heartbeat of the claimant's shard
    on the database's clock every ``heartbeat_interval_s`` (with the keys it has fitted of
    it), notes when the job ended or is being cancelled (:meth:`fitting` then raises
    :class:`FitCancelledError`), and ends the process if ``worker_alive`` (the read end of a
    pipe its worker holds) closes. A claim whose heartbeat is older than ``stale_after_s`` is
    free again, so a shard of a claimant that died is fitted by another.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        *,
        job_id: str,
        worker_id: str,
        stale_after_s: float,
        heartbeat_interval_s: float,
        worker_alive: Connection | None = None,
    ) -> None:
        self._session_factory = session_factory
        self._job_id, self.worker_id = job_id, worker_id
        # One claimant per process: its claims go stale together when it dies.
        self.claimant = f"{worker_id}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._stale_after_s = stale_after_s
        self._worker_alive = worker_alive
        self._keys_fitting = 0
        self._job_ended = threading.Event()
        self._lease = Lease(
            self._beat,
            job_id=job_id,
            interval_s=heartbeat_interval_s,
            worker_alive=worker_alive,
            what="shard heartbeat",
            beat_first=False,
        )

    def __enter__(self) -> ShardStore:
        self._lease.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._lease.stop()

    def _beat(self) -> None:
        with session_scope(self._session_factory) as session:
            unfinished = shard_store.beat_job_shards(
                session,
                job_id=self._job_id,
                claimant=self.claimant,
                now=database_now(session),
                keys_done=self._keys_fitting,
            )
        if not unfinished:
            self._job_ended.set()

    def plan(self, shards: Sequence[tuple[int, IndexArray]]) -> None:
        """Record the job's shards (keys, rows per shard) unless an earlier attempt did."""
        with session_scope(self._session_factory) as session:
            shard_store.plan_job_shards(session, job_id=self._job_id, shards=shards)

    def claim(self) -> shard_store.ShardClaim | None:
        """Claim a free (or stale) shard of the job; None if there is none."""
        with session_scope(self._session_factory) as session:
            now = database_now(session)
            claim = shard_store.claim_job_shard(
                session,
                job_id=self._job_id,
                claimant=self.claimant,
                now=now,
                stale_before=now - timedelta(seconds=self._stale_after_s),
            )
        self._keys_fitting = 0
        if claim is not None:
            logger.info(
                "job %s: shard %d (%d keys, %d rows) claimed by %s",
                self._job_id,
                claim.position,
                claim.n_keys,
                claim.rows.size,
                self.claimant,
            )
        return claim

    def fitting(self, keys_done: int) -> None:
        """Note the keys fitted of the claimed shard; raise :class:`FitCancelledError` once
        the job is finished or being cancelled (its shards' work is then lost anyway)."""
        self._keys_fitting = keys_done
        if self._job_ended.is_set():
            raise FitCancelledError(self._job_id)

    def store(self, position: int, arrays: Mapping[str, NDArray[Any]]) -> bool:
        """Store the fitted shard ``position``; False (nothing stored) if this claimant no
        longer holds it or the job ended. A process whose worker is gone ends here instead:
        the heartbeat notices only at its next beat, and the shards a lost attempt stores
        after its worker died would be credited to an attempt nobody runs any more."""
        exit_if_worker_gone(self._worker_alive, self._job_id)
        with session_scope(self._session_factory) as session:
            stored = shard_store.store_job_shard(
                session,
                job_id=self._job_id,
                position=position,
                claimant=self.claimant,
                worker_id=self.worker_id,
                arrays=arrays,
            )
        if not stored:
            logger.warning(
                "job %s: shard %d was not stored: its claim went to another worker or the "
                "job ended",
                self._job_id,
                position,
            )
        return stored

    def counts(self) -> shard_store.ShardCounts:
        """The shards done and free, and the keys done over every claimant."""
        with read_scope(self._session_factory) as session:
            return shard_store.job_shard_counts(session, job_id=self._job_id)

    def load(self) -> dict[str, NDArray[Any]]:
        """Every stored shard, joined in key order."""
        with read_scope(self._session_factory) as session:
            return shard_store.load_job_shards(session, job_id=self._job_id)


@dataclass(frozen=True)
class ShardPlan:
    """A keyed job's distinct keys (sorted), per shard of ``keys_per_shard`` consecutive ones
    its key count and the rows of its keys (increasing), and the rows without a key."""

    distinct: NDArray[Any]
    shards: list[tuple[int, IndexArray]]
    rows_without_key: int


def plan_shards(
    read_keys: Callable[[], Iterable[NDArray[Any]]],
    keys_per_shard: int,
    *,
    max_key_chars: int | None = None,
    column: str = "keys",
) -> ShardPlan:
    """Plan a keyed job's shards from its key column, read twice block by block (consecutive
    blocks of rows in row order, as :func:`key_values` gives them) by ``read_keys``: the
    distinct keys first, then each block's rows to their shard.

    Memory holds the distinct keys, one block and the plan's row indices, never the whole
    column: a row's shard is the position of its key among the sorted distinct keys, divided
    by ``keys_per_shard``. A text key longer than ``max_key_chars`` raises ``ValueError``
    naming the key ``column`` and its row.
    """
    distinct_parts: list[NDArray[Any]] = []
    rows_without_key = 0
    start = 0
    # Closed at once when a key is refused: the reader holds a database cursor.
    with _closing_blocks(read_keys()) as blocks:
        for block in blocks:
            missing = service_support.missing_keys(block)
            rows_without_key += int(missing.sum())
            distinct_parts.append(np.unique(service_support.key_array(block[~missing])))
            if max_key_chars is not None:
                _check_key_lengths(distinct_parts[-1], block, start, max_key_chars, column)
            start += block.shape[0]
    distinct = (
        np.unique(np.concatenate(distinct_parts)) if distinct_parts else np.zeros(0, np.float64)
    )
    del distinct_parts
    n_shards = -(-distinct.size // keys_per_shard)
    rows_of: list[list[IndexArray]] = [[] for _ in range(n_shards)]
    start = 0
    for block in read_keys():
        present = np.flatnonzero(~service_support.missing_keys(block))
        keys = service_support.key_array(block[present])
        shard_of_row = np.searchsorted(distinct, keys) // keys_per_shard
        # A stable sort keeps each shard's rows increasing, and blocks come in row order.
        order = np.argsort(shard_of_row, kind="stable")
        bounds = np.searchsorted(shard_of_row[order], np.arange(n_shards + 1))
        for shard in np.flatnonzero(np.diff(bounds)):
            rows_of[shard].append(start + present[order[bounds[shard] : bounds[shard + 1]]])
        start += block.shape[0]
    shards: list[tuple[int, IndexArray]] = []
    for position in range(n_shards):
        # Joined shard by shard, each block's part let go: the row indices are held once.
        parts, rows_of[position] = rows_of[position], []
        shards.append(
            (
                min(keys_per_shard, distinct.size - position * keys_per_shard),
                np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64),
            )
        )
        del parts
    return ShardPlan(distinct=distinct, shards=shards, rows_without_key=rows_without_key)


@contextmanager
def _closing_blocks(items: Iterable[NDArray[Any]]) -> Iterator[Iterator[NDArray[Any]]]:
    """An iterator over ``items`` that is closed on leaving (a generator's ``finally`` and
    ``with`` blocks run then, not when it is garbage-collected)."""
    iterator = iter(items)
    try:
        yield iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _check_key_lengths(
    distinct: NDArray[Any], block: NDArray[Any], start: int, max_key_chars: int, column: str
) -> None:
    """Raise naming the first row of ``block`` (whose first row is ``start``) holding a text
    key of ``distinct`` (the block's keys) longer than ``max_key_chars``: every key is
    stored, cached and looked up by each process that serves the model."""
    if distinct.dtype != object or distinct.size == 0:
        return
    lengths = np.fromiter(map(len, distinct), dtype=np.int64, count=distinct.size)
    if int(lengths.max()) <= max_key_chars:
        return
    longest = distinct[int(np.flatnonzero(lengths > max_key_chars)[0])]
    row = start + int(np.flatnonzero(block == longest)[0])
    raise ValueError(
        f"split_by: column '{column}' holds a key of {len(longest):,} characters in row {row} "
        f"(counted from 0); a key may hold at most {max_key_chars:,} (MIXREG_MAX_KEY_CHARS)"
    )


def fit_shard(
    X: FloatArray,
    y: FloatArray,
    keys: NDArray[Any],
    position: int,
    spec: FitSpec,
    small_keys: str,
    progress: Callable[[int], None],
) -> dict[str, NDArray[Any]]:
    """Fit a mixture per key on the rows of shard ``position`` (in row order) and return the
    arrays stored for it (text keys as Python strings, stored as UTF-8: never pickled). The
    shard draws from its own seed (the job's seed and its position), so it fits the same
    whichever worker and attempt fit it. ``progress`` gets the keys fitted so far, between
    batches of keys."""
    fitted = mixreg.fit_per_key(
        X,
        y,
        keys,
        spec.n_components,
        fit_intercept=spec.fit_intercept,
        small_keys="skip" if small_keys == "skip" else "k1",
        global_model=False,
        random_state=np.random.default_rng([spec.seed, position]),
        progress=lambda keys_done, _: progress(keys_done),
    )
    return {
        # Text keys stay Python strings: the store keeps them as UTF-8 bytes and offsets,
        # never at the width of the longest.
        "keys": fitted.keys if fitted.keys.dtype.kind in "iu" else fitted.keys.astype(object),
        "coef": fitted.coef,
        "intercept": fitted.intercept,
        "shares": fitted.shares,
        "min_loss": fitted.min_loss,
        "n_rows": fitted.n_rows,
        "status": fitted.status,
    }


ReadRows = Callable[[IndexArray], tuple[FloatArray, FloatArray, NDArray[Any]]]
"""Reads rows of a keyed job's dataset (increasing indices): their X, y and keys."""


def fit_keyed(
    split: TrainHoldout,
    keyed: KeyedData,
    spec: FitSpec,
    shards: ShardStore,
    *,
    read_keys: Callable[[], Iterable[NDArray[Any]]],
    read_rows: ReadRows,
    wait_s: float,
    progress: ProgressCallback | None = None,
    limits: KeyedLimits = KeyedLimits(),
) -> tuple[FittedSweep, dict[str, Any]]:
    """A keyed fit: the shards planned from the key column (``read_keys``,
    :func:`plan_shards`), the global model of the job's spec on ``split`` (its sample of rows,
    :func:`keyed_global_sample`; a tenth of the progress), then a mixture per key on all rows
    (:func:`mixreg.fit_per_key`), in shards of ``keys_per_shard`` consecutive keys. Progress
    moves through each part in proportion to its rows (:func:`global_progress_share`).

    The shards are planned once per job and stored first, so other workers fit shards while
    this process fits the global model; it then claims and fits shards too, each read by
    ``read_rows`` (only the chunks holding its rows), stored as soon as it is fitted and once.
    Memory holds ``split``, the plan until it is stored, then one shard's rows at a time (and
    one chunk while they are read), never every row. When no shard is free it waits
    ``wait_s`` and looks again: a claim that went stale is free again. Progress counts the
    keys done over every claimant. ``limits`` bounds the keys' length and the coefficients of
    every key's lines, checked before any shard is planned. Returns the global fit and the
    keys' summary (counts by
    status, failures, min-loss quantiles) once every shard is stored.
    """
    plan = plan_shards(
        read_keys, keyed.keys_per_shard, max_key_chars=limits.max_key_chars, column=keyed.split_by
    )
    # Refused before any shard is planned or stored: nothing is left to clean.
    limits.check_coefficients(plan.distinct.size, max(spec.all_n_components), split.n_features)
    shards.plan(plan.shards)
    distinct, rows_without_key = plan.distinct, plan.rows_without_key
    share = global_progress_share(split.X_train.shape[0], sum(rows.size for _, rows in plan.shards))
    del plan

    def global_progress(fraction: float, info: dict[str, Any]) -> None:
        if progress is not None:
            progress(fraction * share, info)

    fitted = fit_split(split, spec, progress=global_progress)
    counted = {"at": -math.inf, "keys_done": 0}

    def key_progress(*, refresh: bool = False) -> None:
        # Called between batches of keys and while waiting: a cancellation stops the fit there.
        if progress is None:
            return
        if refresh or time.monotonic() - counted["at"] >= wait_s:
            counted["at"], counted["keys_done"] = time.monotonic(), shards.counts().keys_done
        fraction = share + (1 - share) * counted["keys_done"] / max(distinct.size, 1)
        progress(fraction, {"keys_done": counted["keys_done"], "n_keys": int(distinct.size)})

    def fitting(keys_done: int) -> None:
        shards.fitting(keys_done)
        key_progress()

    while True:
        claim = shards.claim()
        if claim is None:
            counts = shards.counts()
            key_progress(refresh=True)
            if counts.done == counts.n_shards:
                break
            time.sleep(wait_s)
            continue
        X, y, keys = read_rows(claim.rows)
        arrays = fit_shard(X, y, keys, claim.position, spec, keyed.small_keys, fitting)
        del X, y, keys
        shards.store(claim.position, arrays)
    stored = shards.load()
    n_keys = int(stored["keys"].size) if stored else 0
    summary = mixreg.KeyedMixture(
        keys=stored.get("keys", distinct[:0]),
        coef=stored.get("coef", np.zeros((0, spec.n_components, split.n_features))),
        intercept=stored.get("intercept", np.zeros((0, spec.n_components))),
        shares=stored.get("shares", np.zeros((0, spec.n_components))),
        min_loss=stored.get("min_loss", np.zeros(0)),
        n_rows=stored.get("n_rows", np.zeros(0, dtype=np.int64)),
        status=stored.get("status", np.zeros(0, dtype=np.int8)),
        rows_without_key=rows_without_key,
        failures={
            str(key): service_support.FAILURE_REASON
            for key in stored["keys"][stored["status"] == service_support.STATUSES.index("failed")][
                : service_support.MAX_FAILURES_LISTED
            ]
        }
        if n_keys
        else {},
    ).summary()
    return fitted, summary


def global_progress_share(n_global_rows: int, n_keyed_rows: int) -> float:
    """Share of a keyed fit's progress taken by its global model: its training rows' share of
    the rows fitted, as its search and the keys' fits cost about as much per row
    (bench/RESULTS.md: 82,000 rows/s for the keys, a 10 s search on 1,000,000 rows). A fixed
    tenth held the bar near 10 % for most of a job whose global model fits every row."""
    return n_global_rows / max(n_global_rows + n_keyed_rows, 1)


def key_blocks(session_factory: sessionmaker[Session], keyed: KeyedData) -> Iterator[NDArray[Any]]:
    """The key column of ``keyed``'s dataset, chunk by chunk (:func:`key_values`), in one read
    transaction."""
    with read_scope(session_factory) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=keyed.dataset_id)
        if dataset is None:
            raise JobLostError(f"dataset {keyed.dataset_id} is gone")
        blocks = dataset_store.iter_dataset_columns(
            session, dataset=dataset, names=[keyed.split_by]
        )
        with contextlib.closing(blocks):
            for block in blocks:
                yield check_integer_keys(key_values(block[keyed.split_by]), keyed.split_by)


def read_keyed_rows(
    session_factory: sessionmaker[Session], keyed: KeyedData, rows: IndexArray
) -> tuple[FloatArray, FloatArray, NDArray[Any]]:
    """The rows ``rows`` of ``keyed``'s dataset (X, y, keys), read from the chunks holding
    them only (:func:`models_store.datasets.read_dataset_rows`)."""
    with read_scope(session_factory) as session:
        dataset = dataset_store.get_dataset(session, dataset_id=keyed.dataset_id)
        if dataset is None:
            raise JobLostError(f"dataset {keyed.dataset_id} is gone")
        return dataset_store.read_dataset_rows(
            session, dataset=dataset, rows=rows, column=keyed.split_by
        )


def fit_free_shards(
    session_factory: sessionmaker[Session],
    job_id: str,
    *,
    worker_id: str,
    heartbeat_interval_s: float,
    stale_after_s: float,
    worker_alive: Connection | None,
) -> int:
    """Claim, fit and store free (or stale) shards of the keyed job ``job_id`` until none is
    free, as a claimant of ``worker_id``; return how many this call stored (none once the job
    has ended)."""
    with read_scope(session_factory) as session:
        job = job_store.get_job(session, job_id=job_id)
        if job is None or job.split_by is None or job.status in TERMINAL_JOB_STATUSES:
            return 0
        spec, keyed = FitSpec.of_job(job), KeyedData.of_job(job)
    stored = 0
    with ShardStore(
        session_factory,
        job_id=job_id,
        worker_id=worker_id,
        stale_after_s=stale_after_s,
        heartbeat_interval_s=heartbeat_interval_s,
        worker_alive=worker_alive,
    ) as shards:
        while (claim := shards.claim()) is not None:
            try:
                X, y, keys = read_keyed_rows(session_factory, keyed, claim.rows)
            except JobLostError:
                return stored
            try:
                arrays = fit_shard(
                    X, y, keys, claim.position, spec, keyed.small_keys, shards.fitting
                )
            except FitCancelledError:
                logger.info("job %s ended; shard %d dropped", job_id, claim.position)
                return stored
            del X, y, keys
            stored += shards.store(claim.position, arrays)
    return stored
