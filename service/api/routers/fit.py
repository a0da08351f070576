"""Submit a fit: 202 with the queued job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Body, Header, Request, Response

from service import limits
from service.api.deps import SessionDep, SettingsDep, TaskQueueDep, WorkerDep
from service.api.routing import OffLoopFitRoute, prepared_fit
from service.auth.middleware import ApiKeyDep
from service.fit_schemas import FitAccepted, FitRequest, FitVariant
from service.jobs.submit import prepare_fit, submit_fit
from service.views import job_url

# Inline data make a body of tens of megabytes: parsed and validated in a child process.
router = APIRouter(prefix="/fit", tags=["fit"], route_class=OffLoopFitRoute)


@router.post(
    "",
    status_code=202,
    response_model=FitAccepted,
    responses={
        404: {"description": "dataset_id names no stored dataset"},
        409: {"description": "the Idempotency-Key was used for a different request"},
        429: {
            "description": "the API key has MIXREG_MAX_QUEUED_JOBS_PER_KEY jobs queued or "
            "running; retry after Retry-After seconds"
        },
    },
)
def submit(
    request: Annotated[FitRequest, Body()],
    session: SessionDep,
    settings: SettingsDep,
    worker: WorkerDep,
    task_queue: TaskQueueDep,
    api_key: ApiKeyDep,
    response: Response,
    background: BackgroundTasks,
    http_request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="retrying with the same key and body returns the same job",
            max_length=255,
        ),
    ] = None,
) -> FitAccepted:
    """Queue a fit of a stored dataset or of inline data; poll the returned job URL."""
    body: FitVariant = request
    # A small body is prepared here, in the route's worker thread.
    fit = prepared_fit(http_request) or prepare_fit(body)
    api_key_id = api_key.id if api_key is not None else None
    limits.check_fit_admission(
        session,
        request=fit.request,
        data_shape=fit.data_shape,
        idempotency_key=idempotency_key,
        api_key_id=api_key_id,
        settings=settings,
    )
    submission = submit_fit(
        session,
        fit=fit,
        idempotency_key=idempotency_key,
        api_key_id=api_key_id,
        max_attempts=settings.max_attempts,
        max_k_sweep=settings.max_k_sweep,
        fit_memory_bytes=settings.fit_memory_bytes,
        enqueue=task_queue.enqueue if task_queue is not None else None,
    )
    job = submission.job
    url = job_url(job.id)
    response.headers["Location"] = url
    if not submission.created:
        response.headers["Idempotent-Replayed"] = "true"
    if worker is not None:
        # After the response, i.e. after the commit: the worker then finds the job at once.
        background.add_task(worker.wake)
    return FitAccepted(job_id=job.id, status=job.status, url=url)
