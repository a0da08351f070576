"""The FastAPI application: ``create_app(settings)`` with a lifespan that owns every resource."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session, sessionmaker

from mixreg import ALGORITHMS
from models_store import jobs as job_store
from models_store import migrate
from models_store.session import make_engine, make_sessionmaker, read_scope
from models_store.tables import JOB_STATUSES
from service.api.docs import install_docs
from service.api.errors import install_problem_handlers
from service.api.middleware import BodySizeLimit, EdgeMiddleware
from service.api.routers import (
    datasets,
    fit,
    health,
    inference_v2,
    jobs,
    models,
    outcomes,
    predict,
    registry,
)
from service.api.ui import routes as ui
from service.auth import openapi as auth_openapi
from service.auth.keys import KeyRing
from service.auth.middleware import AuthGate, access_summary
from service.auth.origin import BrowserGuard, parse_allowed_hosts
from service.auth.redaction import install_key_redaction
from service.config import Settings, load_settings
from service.data import json_bodies
from service.jobs.queue import EmbeddedWorker
from service.jobs.task_queue import FitTaskQueue
from service.logs import AccessLog, configure_logging
from service.metrics import ServiceMetrics
from service.serving.cache_check import ModelCacheChecker
from service.serving.endpoint import INLINE_BODY_BYTES, fast_json_predict
from service.serving.outcomes import recent_outcomes
from service.serving.prediction import ModelCache
from service.serving.prediction_log import PredictionLogger
from service.serving.references import ReferenceResolver

logger = logging.getLogger(__name__)

DESCRIPTION = """
Fit a **mixture of k linear regressions** to labelled data in a background job and serve
**list-decoded predictions**: k values per row, one per fitted line. The algorithms are those of
Ghosh, Mazumdar, Pal and Sen, *On Learning Mixture of Linear Regressions in the Non-Realizable
Setting*. Errors are RFC 9457 `application/problem+json`.
"""


OPENAPI_TAGS = [
    {"name": "datasets", "description": "Upload data once, fit it many times."},
    {"name": "fit", "description": "Queue fits as background jobs."},
    {"name": "jobs", "description": "Follow and cancel fit jobs."},
    {"name": "models", "description": "Fitted models: their lines, scores and predictions."},
    {"name": "predict", "description": "k predictions per row, JSON or binary (.npy)."},
    {
        "name": "registered-models",
        "description": "Names whose fits become versions 1, 2, 3, ..., and movable aliases "
        "(name@alias) with their audit trail.",
    },
    {
        "name": "outcomes",
        "description": "The prediction log (sampled predict requests, by request id) and "
        "realised outcomes joined to it: min-loss, best line's share and coverage per window.",
    },
    {
        "name": "inference",
        "description": "The Open Inference Protocol (KServe v2, Triton): health, model "
        "metadata and inference, for off-the-shelf clients.",
    },
]
"""The order of the documentation's sections (the routes are registered in another order)."""


def operation_id(route: APIRoute) -> str:
    """Operation ids ``{tag}-{name}``, e.g. ``jobs-cancel``."""
    tag = route.tags[0] if route.tags else "default"
    return f"{tag}-{route.name.rstrip('_')}"


def _job_counter(session_factory: sessionmaker[Session]) -> dict[str, int]:
    with read_scope(session_factory) as session:
        counts = job_store.count_jobs_by_status(session)
    return {status: counts.get(status, 0) for status in JOB_STATUSES}


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the database, migrations and worker are set up in its lifespan."""
    settings = settings if settings is not None else load_settings()
    configure_logging(settings.log_format)
    metrics = ServiceMetrics()
    keyring = KeyRing(file=settings.api_keys_file, environment=settings.api_keys)
    install_key_redaction()
    access_log = AccessLog()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logger.log(*access_summary(keyring, allow_unauthenticated=settings.allow_unauthenticated))
        await run_in_threadpool(migrate.upgrade, settings.database_url)
        engine = make_engine(settings.database_url)
        session_factory = make_sessionmaker(engine)
        app.state.session_factory = session_factory
        json_bodies.set_parser_niceness(settings.fit_niceness)
        worker: EmbeddedWorker | None = None
        if settings.runs_embedded_worker:
            worker = EmbeddedWorker(
                session_factory=session_factory, settings=settings, metrics=metrics
            )
            worker.start()
            logger.info("embedded worker %s started", worker.worker_id)
        app.state.worker = worker
        # With Procrastinate this process only queues fits; `mixreg worker` processes run them.
        app.state.task_queue = FitTaskQueue() if settings.worker == "procrastinate" else None
        cache_checker = ModelCacheChecker(
            cache=app.state.model_cache,
            session_factory=session_factory,
            interval_s=settings.model_cache_check_interval_s,
        )
        cache_checker.start()
        prediction_log = PredictionLogger(
            session_factory=session_factory,
            default_rate=settings.prediction_log_sample_rate,
            queue_rows=settings.prediction_log_queue_rows,
            flush_interval_s=settings.prediction_log_flush_interval_s,
            refresh_s=settings.alias_refresh_s,
        )
        await run_in_threadpool(prediction_log.start)
        app.state.prediction_log = prediction_log
        try:
            yield
        finally:
            await run_in_threadpool(prediction_log.stop)
            cache_checker.stop()
            if worker is not None:
                await run_in_threadpool(worker.stop)
            await run_in_threadpool(json_bodies.stop_parsers)
            engine.dispose()
            access_log.flush()

    app = FastAPI(
        title="mixreg",
        summary="Mixtures of k linear regressions over HTTP, with list-decoded predictions.",
        description=DESCRIPTION,
        version="0.1.0",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        openapi_tags=OPENAPI_TAGS,
        # Served by install_docs from packaged assets, not from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.keys_required = keyring.enabled
    app.state.model_cache = ModelCache(
        settings.model_cache_size, max_bytes=settings.model_cache_bytes
    )
    app.state.reference_resolver = ReferenceResolver(settings.alias_refresh_s)
    metrics.count_jobs_with(lambda: _job_counter(app.state.session_factory))
    metrics.report_prediction_log_with(lambda: asdict(app.state.prediction_log.counts))
    metrics.report_outcomes_with(
        lambda: recent_outcomes(app.state.session_factory, tolerance=settings.outcome_tolerance)
    )
    app.state.keyring = keyring
    install_problem_handlers(app, union_tags=frozenset(ALGORITHMS))
    # One layer in front of routing: request ids, the page's headers, metrics and access lines,
    # the browser guard, the key check and the body limit, in that order; so a request without
    # a valid key gets no further, whatever its path, and every answer, refusals included,
    # carries its request id. Small JSON predictions of cached models are answered there.
    app.add_middleware(
        EdgeMiddleware,
        metrics=metrics,
        browser_guard=BrowserGuard(allowed_hosts=parse_allowed_hosts(settings.allowed_hosts)),
        auth=AuthGate(
            keyring=keyring,
            metrics_require_key=settings.metrics_require_key,
            allow_unauthenticated=settings.allow_unauthenticated,
        ),
        body_limit=BodySizeLimit(
            max_body_bytes=settings.max_body_bytes,
            max_upload_bytes=settings.max_upload_bytes,
        ),
        access_log=access_log,
        fast_predict=functools.partial(
            fast_json_predict,
            cache=app.state.model_cache,
            resolver=app.state.reference_resolver,
            settings=settings,
            state=app.state,
        ),
        fast_predict_bytes=INLINE_BODY_BYTES,
    )
    # Predictions first: requests are matched against the routes in order, and single-row
    # predictions are the hot path (matching them past every other route cost a third of
    # their time). OPENAPI_TAGS keeps the documentation's order.
    for router in (
        predict.router,
        models.router,
        registry.router,
        datasets.router,
        fit.router,
        jobs.router,
        outcomes.router,
    ):
        app.include_router(router)
    app.include_router(health.router)
    app.include_router(inference_v2.router)
    ui.install(app)
    install_docs(app)
    # Last: it wraps whatever builds the OpenAPI document.
    auth_openapi.install(
        app, authenticated=keyring.enabled, metrics_open=not settings.metrics_require_key
    )
    return app
