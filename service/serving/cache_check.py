"""Keeps an API process's model cache true to the database when other processes delete models.

Each API process (``mixreg serve --workers N``, or several machines) caches decoded models, so
a prediction needs no database access. A model deleted through one process is evicted there at
once; every other process finds out here: a background thread asks the database, every
``MIXREG_MODEL_CACHE_CHECK_INTERVAL_S``, which of its cached models still exist (one small
indexed query, skipped while the cache is empty) and evicts the others. A deleted model is
therefore served for at most about two intervals, and the predict path never waits for the
check.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from models_store import models as model_store
from models_store.session import read_scope
from service.serving.prediction import ModelCache

logger = logging.getLogger(__name__)


def evict_deleted_models(cache: ModelCache, session_factory: sessionmaker[Session]) -> list[str]:
    """Evict the cached models that no longer exist; return their ids."""
    cached = cache.model_ids()
    if not cached:
        return []
    with read_scope(session_factory) as session:
        existing = model_store.existing_model_ids(session, model_ids=cached)
    deleted = [model_id for model_id in cached if model_id not in existing]
    for model_id in deleted:
        cache.evict(model_id)
    return deleted


class ModelCacheChecker:
    """A daemon thread that runs :func:`evict_deleted_models` every ``interval_s``."""

    def __init__(
        self, *, cache: ModelCache, session_factory: sessionmaker[Session], interval_s: float
    ) -> None:
        self._cache = cache
        self._session_factory = session_factory
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="mixreg-model-cache-check", daemon=True
        )

    def start(self) -> None:
        """Start checking in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop checking and wait for the thread to end."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                for model_id in evict_deleted_models(self._cache, self._session_factory):
                    logger.info("model %s was deleted elsewhere; evicted from the cache", model_id)
            except SQLAlchemyError:
                # The next round retries; until then the cache keeps what it has.
                logger.exception("could not check the model cache against the database")
