"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from alembic.runtime.migration import MigrationContext
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from models_store.migrate import head_revision
from service.api.deps import SessionFactoryDep
from service.api.errors import problem_response
from service.api.metrics import ServiceMetrics

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up and serving."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "the database is not usable"}})
def readyz(request: Request, session_factory: SessionFactoryDep) -> JSONResponse:
    """The database answers and its schema is at the newest migration."""
    try:
        with session_factory() as session:
            session.execute(text("SELECT 1"))
            revision = MigrationContext.configure(session.connection()).get_current_revision()
    except SQLAlchemyError as exc:
        return problem_response(
            status=503,
            detail=f"the database is not reachable: {type(exc).__name__}",
            instance=request.url.path,
            slug="not-ready",
        )
    head = head_revision()
    if revision != head:
        return problem_response(
            status=503,
            detail=f"the database schema is at revision {revision}, not at head {head}; "
            f"run `mixreg db upgrade`",
            instance=request.url.path,
            slug="not-ready",
        )
    return JSONResponse({"status": "ready", "database_revision": revision})


@router.get("/metrics", response_class=Response)
def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    service_metrics: ServiceMetrics = request.app.state.metrics
    return Response(service_metrics.render(), media_type=CONTENT_TYPE_LATEST)
