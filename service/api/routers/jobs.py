"""Fit jobs: list, inspect, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Query

from models_store import jobs as job_store
from models_store.tables import TERMINAL_JOB_STATUSES
from service.api import cursors
from service.api.deps import SessionDep, TaskQueueDep, ValidJob, WorkerDep
from service.auth.middleware import ApiKeyDep
from service.errors import ConflictError
from service.schemas import MAX_OFFSET, JobOut, JobStatus, Page
from service.views import job_out

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get("", response_model=Page[JobOut])
def list_(
    session: SessionDep,
    api_key: ApiKeyDep,
    status: Annotated[JobStatus | None, Query(description="only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    cursor: cursors.CursorQuery = None,
) -> Page[JobOut]:
    """Jobs, newest first."""
    after = cursors.page_key(cursor, offset=offset)
    rows, total = job_store.list_jobs(
        session, status=status, limit=limit + 1, offset=offset, after=after
    )
    jobs, next_cursor = cursors.next_page(rows, limit)
    return Page[JobOut](
        items=[job_out(job, caller=api_key) for job in jobs],
        total=total,
        limit=limit,
        offset=offset,
        next_cursor=next_cursor,
    )


@router.get("/{job_id}", response_model=JobOut)
def get(job: ValidJob, api_key: ApiKeyDep) -> JobOut:
    """A job's state, progress, attempts, error, timings and model."""
    return job_out(job, caller=api_key)


@router.post(
    "/{job_id}/cancel",
    status_code=202,
    response_model=JobOut,
    responses={409: {"description": "the job already finished"}},
)
def cancel(
    job: ValidJob,
    session: SessionDep,
    worker: WorkerDep,
    task_queue: TaskQueueDep,
    background: BackgroundTasks,
    api_key: ApiKeyDep,
) -> JobOut:
    """Cancel a job: a queued job at once, a running fit within a second or two."""
    if job.status in TERMINAL_JOB_STATUSES:
        raise ConflictError(f"job {job.id} already finished with status {job.status}")
    cancelled = job_store.request_cancel(session, job_id=job.id)
    assert cancelled is not None  # it existed a moment ago in this transaction
    if task_queue is not None and cancelled.task_id is not None:
        # Committed with the job's flag: the worker running the task is told to abort it.
        task_queue.abort(session, cancelled.task_id)
    if worker is not None:
        background.add_task(worker.wake)
    return job_out(cancelled, caller=api_key)
