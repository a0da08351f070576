"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from alembic.runtime.migration import MigrationContext
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from models_store.migrate import head_revision
from service.api.deps import SessionFactoryDep, SettingsDep, TaskQueueDep
from service.auth.keys import ApiKey
from service.auth.middleware import ApiKeyDep, is_local_client
from service.data import json_bodies
from service.metrics import ServiceMetrics
from service.problems import problem_response
from service.schemas import QueueStatus, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up and serving."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={
        503: {
            "description": "the database (or the task queue) is not usable, or the processes "
            "that parse big JSON bodies are being started again"
        }
    },
)
def readyz(
    request: Request,
    session_factory: SessionFactoryDep,
    settings: SettingsDep,
    task_queue: TaskQueueDep,
    api_key: ApiKeyDep,
) -> Readiness | JSONResponse:
    """The database answers and its schema is at the newest migration; with
    MIXREG_WORKER=procrastinate, also the task queue (and how many workers are alive); and the
    processes that parse big JSON bodies have not lost a child (a pool that did is started
    again here, and is ready once a new child answers). The revision, worker mode and queue
    counts are shown with a key, or without keys on loopback."""
    queue: QueueStatus | None = None
    try:
        with session_factory() as session:
            session.execute(text("SELECT 1"))
            revision = MigrationContext.configure(session.connection()).get_current_revision()
            summary = (
                None
                if task_queue is None
                else task_queue.summary(session, stale_after_s=settings.stale_after_s)
            )
    except SQLAlchemyError as exc:
        return _not_ready(request, f"the database is not reachable: {type(exc).__name__}")
    head = head_revision()
    if revision != head:
        return _not_ready(
            request,
            f"the database schema is at revision {revision}, not at head {head}; "
            f"run `mixreg db upgrade`",
        )
    if task_queue is not None:
        if summary is None:
            return _not_ready(
                request, "the Procrastinate queue is not installed; run `mixreg db upgrade`"
            )
        queue = QueueStatus(workers=summary.workers, waiting=summary.waiting)
    parser_trouble = json_bodies.parser_trouble()
    if parser_trouble is not None:
        return _not_ready(request, parser_trouble)
    if not _shows_details(request, api_key):
        return Readiness(status="ready")
    return Readiness(
        status="ready", database_revision=revision, worker=settings.worker, queue=queue
    )


def _shows_details(request: Request, api_key: ApiKey | None) -> bool:
    """Whether the caller may see how the service runs: with a key, or on a server without
    keys from its own machine (the probe is open, so strangers see only the status)."""
    if api_key is not None:
        return True
    keyring_enabled: bool = request.app.state.keys_required
    return not keyring_enabled and is_local_client(request.scope.get("client"))


def _not_ready(request: Request, detail: str) -> JSONResponse:
    return problem_response(status=503, detail=detail, instance=request.url.path, slug="not-ready")


@router.get("/metrics", response_class=Response)
def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    service_metrics: ServiceMetrics = request.app.state.metrics
    return Response(service_metrics.render(), media_type=CONTENT_TYPE_LATEST)
