"""Dependencies: settings, the per-request unit of work, and "does it exist?" checks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session, sessionmaker

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.session import read_scope, session_scope
from models_store.tables import Dataset, Job, Model
from service.config import Settings
from service.data import model_references
from service.errors import NotFoundError
from service.jobs.queue import EmbeddedWorker
from service.jobs.task_queue import FitTaskQueue
from service.serving import references
from service.serving.prediction import ModelCache


# The accessors of app state are coroutines: FastAPI runs a plain function dependency in its thread
# pool, a hop that costs more than a whole single-row prediction.
async def get_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    settings: Settings = request.app.state.settings
    return settings


async def get_session_factory(request: Request) -> sessionmaker[Session]:
    """The session factory built in the app's lifespan."""
    factory: sessionmaker[Session] = request.app.state.session_factory
    return factory


async def get_model_cache(request: Request) -> ModelCache:
    """The app's cache of decoded models."""
    cache: ModelCache = request.app.state.model_cache
    return cache


async def get_reference_resolver(request: Request) -> references.ReferenceResolver:
    """What this process remembers of resolved ``name@alias`` references."""
    resolver: references.ReferenceResolver = request.app.state.reference_resolver
    return resolver


def get_worker(request: Request) -> EmbeddedWorker | None:
    """The embedded worker, if this app runs one."""
    worker: EmbeddedWorker | None = request.app.state.worker
    return worker


def get_task_queue(request: Request) -> FitTaskQueue | None:
    """The Procrastinate queue of fit tasks (``MIXREG_WORKER=procrastinate``), else None."""
    task_queue: FitTaskQueue | None = request.app.state.task_queue
    return task_queue


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
ModelCacheDep = Annotated[ModelCache, Depends(get_model_cache)]
ReferenceResolverDep = Annotated[references.ReferenceResolver, Depends(get_reference_resolver)]
WorkerDep = Annotated[EmbeddedWorker | None, Depends(get_worker)]
TaskQueueDep = Annotated[FitTaskQueue | None, Depends(get_task_queue)]


# Methods that only read: their unit of work takes no write lock (see models_store.session).
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def get_session(request: Request, session_factory: SessionFactoryDep) -> Iterator[Session]:
    """One unit of work per request: committed when the route returns, rolled back if it raises.

    A ``GET`` only reads, in a transaction that neither waits for a writer nor blocks one.
    """
    scope = read_scope if request.method in READ_METHODS else session_scope
    with scope(session_factory) as session:
        yield session


# scope="function": commit before the response is sent, so a client never sees an id that a
# failed commit would take back.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def valid_dataset(
    dataset_id: Annotated[str, Path(description="id of a stored dataset")], session: SessionDep
) -> Dataset:
    """The dataset named in the path, or 404."""
    dataset = dataset_store.get_dataset(session, dataset_id=dataset_id)
    if dataset is None:
        raise NotFoundError(f"dataset {dataset_id} does not exist")
    return dataset


def valid_job(
    job_id: Annotated[str, Path(description="id of a fit job")], session: SessionDep
) -> Job:
    """The job named in the path, or 404."""
    job = job_store.get_job(session, job_id=job_id)
    if job is None:
        raise NotFoundError(f"job {job_id} does not exist")
    return job


MODEL_REFERENCE = "a model: its id, name@alias, or a registered model's name (latest version)"


def valid_model(
    model_id: Annotated[str, Path(description=MODEL_REFERENCE)], session: SessionDep
) -> Model:
    """The model named in the path (by id or reference), or 404."""
    return model_references.get_model(session, model_id)


def valid_model_version(
    name: Annotated[str, Path(description="a registered model's name")],
    version: Annotated[int, Path(description="its version number", ge=1, le=999_999_999)],
    session: SessionDep,
) -> Model:
    """Version ``version`` of the registered model ``name``, or 404."""
    return model_references.get_model(session, f"{name}/versions/{version}")


ValidDataset = Annotated[Dataset, Depends(valid_dataset)]
ValidJob = Annotated[Job, Depends(valid_job)]
ValidModel = Annotated[Model, Depends(valid_model)]
ValidModelVersion = Annotated[Model, Depends(valid_model_version)]
