"""The FastAPI application: ``create_app(settings)`` with a lifespan that owns every resource."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session, sessionmaker

from mixreg import ALGORITHMS
from models_store import migrate, repository
from models_store.session import make_engine, make_sessionmaker, session_scope
from models_store.tables import JOB_STATUSES
from service.api.errors import install_problem_handlers
from service.api.metrics import ServiceMetrics
from service.api.middleware import BodySizeLimitMiddleware, MetricsMiddleware
from service.api.routers import datasets, fit, health, jobs, models, predict
from service.config import Settings
from service.jobs.queue import EmbeddedWorker
from service.serving.prediction import ModelCache

logger = logging.getLogger(__name__)

DESCRIPTION = """
Fit a **mixture of k linear regressions** to labelled data in a background job and serve
**list-decoded predictions**: k values per row, one per fitted line. The algorithms are those of
Ghosh, Mazumdar, Pal and Sen, *On Learning Mixture of Linear Regressions in the Non-Realizable
Setting*. Errors are RFC 9457 `application/problem+json`.
"""


def operation_id(route: APIRoute) -> str:
    """Operation ids ``{tag}-{name}``, e.g. ``jobs-cancel``."""
    tag = route.tags[0] if route.tags else "default"
    return f"{tag}-{route.name.rstrip('_')}"


def _job_counter(session_factory: sessionmaker[Session]) -> dict[str, int]:
    with session_scope(session_factory) as session:
        counts = repository.count_jobs_by_status(session)
    return {status: counts.get(status, 0) for status in JOB_STATUSES}


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the database, migrations and worker are set up in its lifespan."""
    settings = settings if settings is not None else Settings()
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(migrate.upgrade, settings.database_url)
        engine = make_engine(settings.database_url)
        session_factory = make_sessionmaker(engine)
        app.state.session_factory = session_factory
        worker: EmbeddedWorker | None = None
        if settings.embedded_worker:
            worker = EmbeddedWorker(
                session_factory=session_factory, settings=settings, metrics=metrics
            )
            worker.start()
            logger.info("embedded worker %s started", worker.worker_id)
        app.state.worker = worker
        try:
            yield
        finally:
            if worker is not None:
                await run_in_threadpool(worker.stop)
            engine.dispose()

    app = FastAPI(
        title="mixreg",
        summary="Mixtures of k linear regressions over HTTP, with list-decoded predictions.",
        description=DESCRIPTION,
        version="0.1.0",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.model_cache = ModelCache(settings.model_cache_size)
    metrics.count_jobs_with(lambda: _job_counter(app.state.session_factory))
    install_problem_handlers(app, union_tags=frozenset(ALGORITHMS))
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    for router in (datasets.router, fit.router, jobs.router, models.router, predict.router):
        app.include_router(router)
    app.include_router(health.router)
    return app
