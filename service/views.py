"""Response bodies built from stored rows (inside the unit of work that read them)."""

from __future__ import annotations

from models_store.tables import Dataset, Job, Model
from service.schemas import (
    Baseline,
    Component,
    DatasetOut,
    JobOut,
    ModelOut,
    ModelSummary,
    Progress,
)


def dataset_url(dataset_id: str) -> str:
    """Path of a dataset resource."""
    return f"/datasets/{dataset_id}"


def job_url(job_id: str) -> str:
    """Path of a job resource."""
    return f"/jobs/{job_id}"


def model_url(model_id: str) -> str:
    """Path of a model resource."""
    return f"/models/{model_id}"


def dataset_out(dataset: Dataset) -> DatasetOut:
    """The public view of a dataset (without its values)."""
    return DatasetOut(
        id=dataset.id,
        name=dataset.name,
        n_rows=dataset.n_rows,
        n_features=dataset.n_features,
        feature_names=list(dataset.feature_names),
        target_name=dataset.target_name,
        created_at=dataset.created_at,
        url=dataset_url(dataset.id),
    )


def job_out(job: Job) -> JobOut:
    """The public view of a job."""
    return JobOut(
        id=job.id,
        status=job.status,
        name=job.name,
        dataset_id=job.dataset_id,
        algorithm=job.algorithm,
        n_components=job.n_components,
        params=dict(job.params),
        fit_intercept=job.fit_intercept,
        holdout_fraction=job.holdout_fraction,
        seed=job.seed,
        time_budget_s=job.time_budget_s,
        progress=Progress(
            fraction=job.progress_fraction,
            iteration=job.progress_iteration,
            candidates_tried=job.progress_candidates,
            best_min_loss=job.progress_best_loss,
        ),
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        cancel_requested=job.cancel_requested,
        error=job.error,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        model_id=job.model_id,
        model_url=model_url(job.model_id) if job.model_id else None,
        url=job_url(job.id),
    )


def model_summary(model: Model) -> ModelSummary:
    """A model as listed."""
    return ModelSummary(
        id=model.id,
        name=model.name,
        algorithm=model.algorithm,
        n_components=model.n_components,
        n_features=model.n_features,
        train_min_loss=model.train_min_loss,
        holdout_min_loss=model.holdout_min_loss,
        dataset_id=model.dataset_id,
        job_id=model.job_id,
        created_at=model.created_at,
        url=model_url(model.id),
    )


def model_out(model: Model) -> ModelOut:
    """The full public view of a model: its θ list, scores, baseline and provenance."""
    components = [
        Component(coef=list(coef), intercept=intercept, share=share)
        for coef, intercept, share in zip(model.coef, model.intercept, model.shares, strict=True)
    ]
    return ModelOut(
        **model_summary(model).model_dump(),
        feature_names=list(model.feature_names),
        fit_intercept=model.fit_intercept,
        components=components,
        baseline=Baseline.model_validate(model.baseline),
        params=dict(model.params),
        seed=model.seed,
        n_train=model.n_train,
        n_holdout=model.n_holdout,
        loss_history=list(model.loss_history),
        n_iter=model.n_iter,
        fit_seconds=model.fit_seconds,
    )
