"""The prediction log: sampled predict requests, written off the hot path.

A predict handler calls :meth:`PredictionLogger.offer` once its answer is computed. That call
only decides whether the request is sampled (a dict lookup and a random draw) and, if so,
appends what was asked — the request id, the time, the model's decoded lines (immutable,
shared with the model cache), the reference, the rows and keys — to an in-process queue. A
background thread wakes every ``MIXREG_PREDICTION_LOG_FLUSH_INTERVAL_S``, computes the rows'
k values again with the same function that answered them (so they are the answer, bit for
bit, at no cost to the request) and writes the batch in one transaction.

The queue holds at most ``MIXREG_PREDICTION_LOG_QUEUE_ROWS`` rows: beyond, a request is not
logged and its rows are counted as dropped (``/metrics``); predict never waits for the
database.

Sampling is per request (all its rows or none), at the rate set for the reference it named
(``name@alias``), else for the model id it resolved to, else the default
``MIXREG_PREDICTION_LOG_SAMPLE_RATE``. The rates are read from the database every
``MIXREG_ALIAS_REFRESH_S`` by the writer thread, and at once in the process that sets them.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from models_store import prediction_log
from models_store.session import read_scope, session_scope
from service.data.model_references import parse_reference
from service.errors import ServiceError
from service.serving.prediction import (
    Concomitant,
    FloatArray,
    StoredLines,
    gate_columns,
    predict_gated,
    predict_rows,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class PendingPrediction:
    """A sampled predict request, as the handler hands it over (not frozen: a frozen
    dataclass's ``__init__`` costs several times more, on the hot path)."""

    request_id: str
    logged_at: float
    """Seconds since the Unix epoch (``time.time()``: cheaper than a datetime)."""
    reference: str
    lines: StoredLines
    X: FloatArray
    keys: Sequence[str | int] | None
    unknown_keys: str
    concomitant: Concomitant | None


@dataclass
class LogCounts:
    """What the log did since the process started (exported on ``/metrics``)."""

    sampled_rows: int = 0
    dropped_rows: int = 0
    written_rows: int = 0
    failed_rows: int = 0
    queued_rows: int = 0
    writer_cpu_seconds: float = 0.0
    """CPU time spent computing and writing the sampled rows (the log's cost besides the
    sampling check and the queue append of each request)."""


class PredictionLogger:
    """Samples predict requests and writes them from a background thread (see the module)."""

    def __init__(
        self,
        *,
        session_factory: sessionmaker[Session],
        default_rate: float,
        queue_rows: int,
        flush_interval_s: float,
        refresh_s: float,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._session_factory = session_factory
        self._default_rate = default_rate
        self._capacity = queue_rows
        self._flush_interval_s = flush_interval_s
        self._refresh_s = refresh_s
        self._draw = draw
        # Replaced whole, never changed in place: the hot path reads it without a lock.
        self._rates: dict[str, float] = {}
        self._pending: deque[PendingPrediction] = deque()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.counts = LogCounts()

    # The hot path -------------------------------------------------------------------------

    def offer(
        self,
        *,
        request_id: str | None,
        reference: str,
        lines: StoredLines,
        X: FloatArray,
        keys: Sequence[str | int] | None,
        unknown_keys: str,
        concomitant: Concomitant | None,
    ) -> None:
        """Log this answered request if it is sampled and the queue has room for its rows."""
        rates = self._rates
        rate = rates.get(reference)
        if rate is None:
            rate = rates.get(lines.model_id, self._default_rate)
        if rate <= 0.0 or request_id is None or (rate < 1.0 and self._draw() >= rate):
            return
        n_rows = len(X)
        with self._lock:
            counts = self.counts
            counts.sampled_rows += n_rows
            if counts.queued_rows + n_rows > self._capacity:
                counts.dropped_rows += n_rows
                return
            counts.queued_rows += n_rows
            self._pending.append(
                PendingPrediction(
                    request_id=request_id,
                    logged_at=time.time(),
                    reference=reference,
                    lines=lines,
                    X=X,
                    keys=keys,
                    unknown_keys=unknown_keys,
                    concomitant=concomitant,
                )
            )

    # Settings -----------------------------------------------------------------------------

    def set_rate(self, target: str, rate: float | None) -> None:
        """Apply a rate just set (None: removed) in this process at once."""
        rates = dict(self._rates)
        if rate is None:
            rates.pop(target, None)
        else:
            rates[target] = rate
        self._rates = rates

    def set_rate_after_commit(self, session: Session, target: str, rate: float | None) -> None:
        """Apply a rate (None: removed) in this process once ``session`` commits it."""
        event.listen(session, "after_commit", lambda _: self.set_rate(target, rate), once=True)

    @property
    def default_rate(self) -> float:
        """The rate of targets without one of their own."""
        return self._default_rate

    def refresh_rates(self) -> None:
        """Read every target's rate from the database."""
        with read_scope(self._session_factory) as session:
            settings = prediction_log.list_settings(session)
        self._rates = {setting.target: setting.sample_rate for setting in settings}

    # The writer ---------------------------------------------------------------------------

    def start(self) -> None:
        """Read the rates, then start the writer thread."""
        self.refresh_rates()
        self._thread = threading.Thread(target=self._run, name="prediction-log", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write what is queued, then stop the writer thread."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        since_refresh = 0.0
        while not self._stopping.is_set():
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            self.flush()
            since_refresh += self._flush_interval_s
            if since_refresh >= self._refresh_s:
                since_refresh = 0.0
                try:
                    self.refresh_rates()
                except Exception:  # a database briefly away: keep the rates known
                    logger.exception("could not read the prediction log's rates")
        self.flush()

    def flush(self) -> int:
        """Write every queued request in one transaction; the rows written. A flush that
        another thread is running is waited for, so what was queued before the call is
        written when it returns."""
        with self._flush_lock:
            started = time.thread_time()
            try:
                return self._flush()
            finally:
                spent = time.thread_time() - started
                with self._lock:
                    self.counts.writer_cpu_seconds += spent

    def _flush(self) -> int:
        with self._lock:
            batch = list(self._pending)
            self._pending.clear()
        if not batch:
            return 0
        n_rows = sum(len(pending.X) for pending in batch)
        rows: list[tuple[Any, ...]] = []
        try:
            for pending in batch:
                rows.extend(_logged_rows(pending))
            with session_scope(self._session_factory) as session:
                prediction_log.insert_logged_rows(session, rows)
        except Exception:
            logger.exception("could not write %d logged prediction rows", n_rows)
            with self._lock:
                self.counts.failed_rows += n_rows
                self.counts.queued_rows -= n_rows
            return 0
        with self._lock:
            self.counts.written_rows += n_rows
            self.counts.queued_rows -= n_rows
        return n_rows


def _logged_rows(pending: PendingPrediction) -> list[tuple[Any, ...]]:
    """The log's rows of one request (``prediction_log.LOGGED_COLUMNS``): its answer computed
    again, as it was answered."""
    lines = pending.lines
    try:
        predictions = predict_rows(
            lines, pending.X, pending.keys, unknown_keys=pending.unknown_keys
        )
        most_likely: list[int] | None = None
        if lines.gate is not None:
            columns = gate_columns(lines, pending.X, pending.concomitant)
            gated = predict_gated(lines, predictions, columns)
            most_likely = np.asarray(gated.most_likely_component).tolist()
    except ServiceError:  # cannot happen for an answered request; never stop the writer
        logger.exception("a logged request could not be predicted again")
        return []
    keys = pending.keys
    logged_at = datetime.fromtimestamp(pending.logged_at, tz=UTC)
    alias = _alias_of(pending.reference)
    # float64 is little-endian on every platform the service runs on; "<f8" makes sure.
    features = pending.X.astype("<f8", copy=False)
    values = predictions.astype("<f8", copy=False)
    return [
        (
            pending.request_id,
            row,
            logged_at,
            lines.model_id,
            lines.registered_model,
            lines.version,
            alias,
            None if keys is None else str(keys[row]),
            features[row].tobytes(),
            values[row].tobytes(),
            None if most_likely is None else most_likely[row],
        )
        for row in range(len(features))
    ]


@functools.lru_cache(maxsize=1024)
def _alias_of(reference: str) -> str | None:
    """The alias ``reference`` names (``production`` of ``name@production``), if any."""
    try:
        return parse_reference(reference).alias
    except ServiceError:
        return None
