"""Pictures of fits (``/models/{id}/plot.png``, ``/jobs/{id}/plot.png``) and the read-only
web page (``/ui``), rendered on the server from the stored rows.

The routes are plain ``def`` functions, so FastAPI runs them in its worker threads: reading a
dataset and drawing never block the event loop. Each reads in a short unit of work and draws
after it has ended, so no database lock is held while matplotlib works.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store import models as model_store
from models_store import registry
from models_store.session import read_scope
from models_store.tables import Job, Model, ModelVersion
from service.api.deps import SessionFactoryDep
from service.api.ui import plots, sign_in
from service.auth.middleware import ApiKeyDep
from service.data import model_references
from service.errors import ConflictError, NotFoundError
from service.schemas import GateOut
from service.views import job_out, model_out, model_summary

HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(directory=HERE / "templates")
STATIC_PATH = "/ui/static"
# Seconds between refreshes of the page: quick while a fit runs, slow when all is quiet.
REFRESH_ACTIVE_S = 2
REFRESH_IDLE_S = 15
PAGE_JOBS = 25
PAGE_MODELS = 12

router = APIRouter(tags=["plots"])
pages = APIRouter(include_in_schema=False)

PNG_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"image/png": {}}, "description": "a PNG picture"},
    304: {"description": "the picture named by If-None-Match has not changed"},
}


def get_picture_cache(request: Request) -> plots.PictureCache:
    """The app's cache of rendered pictures."""
    cache: plots.PictureCache = request.app.state.picture_cache
    return cache


PictureCacheDep = Annotated[plots.PictureCache, Depends(get_picture_cache)]


def install(app: Any) -> None:
    """Add the picture routes, the page and its static files to ``app``."""
    app.state.picture_cache = plots.PictureCache(capacity=64)
    app.mount(STATIC_PATH, StaticFiles(directory=HERE / "static"), name="ui-static")
    app.include_router(router)
    app.include_router(pages)
    app.include_router(sign_in.install(TEMPLATES))


def _title(kind: str, name: str | None, identifier: str) -> str:
    return f"{kind} {name} ({identifier[:8]})" if name else f"{kind} {identifier}"


def _model_picture(session: Session, model: Model) -> plots.ModelPicture:
    dataset = dataset_store.get_dataset(session, dataset_id=model.dataset_id)
    if dataset is None:
        raise NotFoundError(
            f"the dataset {model.dataset_id} of model {model.id} is gone (deleted, or the model "
            f"was imported); the picture needs its rows"
        )
    X, y = dataset_store.sample_dataset_rows(session, dataset=dataset, max_rows=plots.MAX_POINTS)
    shape = (model.n_components, model.n_features)
    # A keyed model's own lines are its global model's (every key's rows): the title says so,
    # since a key's lines would look different.
    keyed = f", global model of the keys of {model.split_by}" if model.split_by else ""
    return plots.ModelPicture(
        title=f"{_title('model', model.name, model.id)}{keyed}: k={model.n_components}, "
        f"{model.algorithm}, holdout min-loss "
        f"{'-' if model.holdout_min_loss is None else f'{model.holdout_min_loss:.4g}'}",
        coef=np.asarray(model.coef, dtype=np.float64).reshape(shape),
        intercept=np.asarray(model.intercept, dtype=np.float64),
        feature_names=list(model.feature_names),
        target_name=dataset.target_name,
        loss_history=list(model.loss_history),
        X=X,
        y=y,
        n_rows=dataset.n_rows,
        shares=np.asarray(model.shares, dtype=np.float64),
        n_iter=model.n_iter,
        converged=model.converged,
        bands=_confidence_bands(model),
    )


def _confidence_bands(model: Model) -> plots.ConfidenceBands | None:
    """The maximum-likelihood lines and their covariances, when every line has them."""
    uncertainty = model.uncertainty
    if uncertainty is None:
        return None
    lines = uncertainty["components"]
    if any(line["covariance"] is None for line in lines):
        return None
    estimates = [
        [item["estimate"] for item in line["coef"]]
        + ([line["intercept"]["estimate"]] if model.fit_intercept else [])
        for line in lines
    ]
    return plots.ConfidenceBands(
        lines=np.asarray(estimates, dtype=np.float64),
        covariances=np.asarray([line["covariance"] for line in lines], dtype=np.float64),
        level=float(uncertainty["level"]),
    )


def _sweep_picture(job: Job) -> plots.SweepPicture:
    sweep = job.sweep
    assert sweep is not None
    entries = sorted(sweep["models"], key=lambda entry: entry["n_components"])
    return plots.SweepPicture(
        title=f"{_title('k sweep', job.name, job.id)}, {job.algorithm}",
        k_values=[entry["n_components"] for entry in entries],
        train_min_loss=[entry["train_min_loss"] for entry in entries],
        holdout_min_loss=[entry["holdout_min_loss"] for entry in entries],
        bic=[entry["bic"] for entry in entries],
        best_k=sweep["best_n_components"],
    )


def _png_response(request: Request, png: bytes | None, etag: str) -> Response:
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if png is None:
        return Response(status_code=304, headers=headers)
    return Response(png, media_type="image/png", headers=headers)


def _unchanged(request: Request, etag: str) -> bool:
    return etag in [tag.strip() for tag in request.headers.get("if-none-match", "").split(",")]


@router.get("/models/{model_id}/plot.png", response_class=Response, responses=PNG_RESPONSE)
def model_plot(
    model_id: str, request: Request, session_factory: SessionFactoryDep, cache: PictureCacheDep
) -> Response:
    """A picture of the fit: with one feature the rows and the k lines, each row coloured by
    its best line; with several, each row's target against its best line's prediction; beside
    it the training loss per iteration."""
    picture: plots.ModelPicture | None = None
    with read_scope(session_factory) as session:
        # By id, name@alias or version; the picture is the resolved model's.
        model = model_references.get_model(session, model_id)
        resolved_id = model.id
        etag = f'"model-{resolved_id}"'
        png = cache.get(resolved_id)
        if png is None and not _unchanged(request, etag):
            picture = _model_picture(session, model)
    if _unchanged(request, etag):
        return _png_response(request, None, etag)
    if png is None:
        assert picture is not None
        png = plots.render_model(picture)
        cache.put(resolved_id, png)
    return _png_response(request, png, etag)


@router.get(
    "/jobs/{job_id}/plot.png",
    response_class=Response,
    responses={**PNG_RESPONSE, 409: {"description": "the k sweep has not succeeded (yet)"}},
)
def sweep_plot(
    job_id: str, request: Request, session_factory: SessionFactoryDep, cache: PictureCacheDep
) -> Response:
    """A picture of a k sweep: train and holdout min-loss against k, and BIC against k with
    the preferred k marked."""
    etag = f'"sweep-{job_id}"'
    with read_scope(session_factory) as session:
        job = job_store.get_job(session, job_id=job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} does not exist")
        if job.k_values is None:
            where = (
                f"; its model's picture is /models/{job.model_id}/plot.png" if job.model_id else ""
            )
            raise NotFoundError(f"job {job_id} fits one k, not a k sweep{where}")
        if job.status != "succeeded" or job.sweep is None:
            raise ConflictError(
                f"job {job_id} is {job.status}; its sweep is drawn once it has succeeded"
            )
        picture = _sweep_picture(job)
    if _unchanged(request, etag):
        return _png_response(request, None, etag)
    png = cache.get(f"sweep-{job_id}")
    if png is None:
        png = plots.render_sweep(picture)
        cache.put(f"sweep-{job_id}", png)
    return _png_response(request, png, etag)


# --- the page ---


@pages.get("/", response_class=RedirectResponse)
def root() -> RedirectResponse:
    """The page is the front door for a person with a browser."""
    return RedirectResponse("/ui")


# Pages of a list the page links to; far more than any server holds, and a bound on the offset.
MAX_PAGE = 10**9


def _pager(page: int, per_page: int, total: int) -> dict[str, int]:
    """Where a page of a list is: its number, the last page's, the rows it shows."""
    last = max(1, -(-total // per_page))
    first_row = (page - 1) * per_page + 1
    return {
        "page": page,
        "last": last,
        "first_row": first_row,
        "last_row": min(first_row + per_page - 1, total),
        "total": total,
    }


def _aliases_of_versions(
    session: Session, versions: dict[str, ModelVersion]
) -> dict[str, list[str]]:
    """Model id -> the aliases that point at it, for the models that are versions: the
    aliases of each registered model are read once."""
    by_version: dict[tuple[str, int], list[str]] = {}
    for name in {version.registered_model for version in versions.values()}:
        for alias in registry.list_aliases(session, name=name):
            by_version.setdefault((name, alias.version), []).append(alias.alias)
    return {
        model_id: by_version.get((version.registered_model, version.version), [])
        for model_id, version in versions.items()
    }


@pages.get("/ui", response_class=HTMLResponse)
def overview(
    request: Request,
    session_factory: SessionFactoryDep,
    api_key: ApiKeyDep,
    jobs_page: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1,
    models_page: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1,
) -> HTMLResponse:
    """Jobs with their progress, and models with their scores and pictures, a page of each."""
    with read_scope(session_factory) as session:
        jobs, jobs_total = job_store.list_jobs(
            session, status=None, limit=PAGE_JOBS, offset=(jobs_page - 1) * PAGE_JOBS
        )
        models, models_total = model_store.list_models(
            session, limit=PAGE_MODELS, offset=(models_page - 1) * PAGE_MODELS
        )
        counts = job_store.count_jobs_by_status(session)
        job_views = [job_out(job, caller=api_key) for job in jobs]
        versions = registry.versions_of_models(session, model_ids=[model.id for model in models])
        model_views = [model_summary(model, versions.get(model.id)) for model in models]
        aliases = _aliases_of_versions(session, versions)
    active = counts.get("queued", 0) + counts.get("running", 0)
    return TEMPLATES.TemplateResponse(
        request,
        "overview.html",
        {
            "jobs": job_views,
            "jobs_total": jobs_total,
            "models": model_views,
            "aliases": aliases,
            "models_total": models_total,
            "jobs_pager": _pager(jobs_page, PAGE_JOBS, jobs_total),
            "models_pager": _pager(models_page, PAGE_MODELS, models_total),
            "counts": counts,
            "refresh_s": REFRESH_ACTIVE_S if active else REFRESH_IDLE_S,
            "now": datetime.now(UTC),
            "signed_in": sign_in.signed_in_as(request),
        },
    )


@pages.get("/ui/models/{model_id}", response_class=HTMLResponse)
def model_page(request: Request, model_id: str, session_factory: SessionFactoryDep) -> HTMLResponse:
    """One model: its picture, lines, scores and warnings."""
    with read_scope(session_factory) as session:
        model = model_references.get_model(session, model_id)
        view = model_out(model, registry.version_of_model(session, model_id=model.id))
        table = (
            None
            if model.groups_column is None
            else model_store.load_group_table(session, model_id=model.id)
        )
    groups_per_line = (
        None if table is None else np.bincount(table.lines, minlength=view.n_components).tolist()
    )
    return TEMPLATES.TemplateResponse(
        request,
        "model.html",
        {
            "model": view,
            "groups_per_line": groups_per_line,
            "gate_reference": _gate_reference(view.gate),
            "now": datetime.now(UTC),
            "signed_in": sign_in.signed_in_as(request),
        },
    )


def _gate_reference(gate: GateOut | None) -> int | None:
    """The line whose gate row is fixed at zero (the multinomial logit's reference), if any."""
    if gate is None:
        return None
    rows = np.column_stack([np.asarray(gate.coef, dtype=np.float64), gate.intercept])
    fixed = np.flatnonzero(~rows.any(axis=1))
    return int(fixed[0]) if fixed.size else None
