"""Response bodies built from stored rows (inside the unit of work that read them)."""

from __future__ import annotations

from typing import Any

from models_store.tables import Dataset, Job, Model, ModelVersion
from service.auth.keys import ApiKey
from service.jobs.fit_spec import beats_baseline
from service.schemas import (
    Baseline,
    Candidate,
    ColumnOut,
    Component,
    ComponentEstimates,
    DatasetOut,
    GateOut,
    GroupMetrics,
    JobOut,
    KeyedSummary,
    ModelOut,
    ModelSummary,
    Progress,
    Sweep,
    SweepModel,
    Uncertainty,
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
        columns=[
            ColumnOut(name=column["name"], type=column["type"]) for column in dataset.extra_columns
        ],
        created_at=dataset.created_at,
        url=dataset_url(dataset.id),
    )


def job_out(job: Job, *, caller: ApiKey | None) -> JobOut:
    """The public view of a job, as ``caller`` may see it.

    The worker that runs the job (its host and process id) tells how the service is deployed:
    only a ``write`` key, or a caller of a server without keys, sees it.
    """
    shows_worker = caller is None or caller.grants("write")
    return JobOut(
        id=job.id,
        status=job.status,
        name=job.name,
        registered_model=job.registered_model,
        dataset_id=job.dataset_id,
        algorithm=job.algorithm,
        n_components=job.n_components,
        k_values=None if job.k_values is None else list(job.k_values),
        params=dict(job.params),
        gating=job.gating,
        fit_intercept=job.fit_intercept,
        holdout_fraction=job.holdout_fraction,
        seed=job.seed,
        time_budget_s=job.time_budget_s,
        progress=Progress(
            fraction=job.progress_fraction,
            iteration=job.progress_iteration,
            candidates_tried=job.progress_candidates,
            best_min_loss=job.progress_best_loss,
            n_components=job.progress_n_components,
            keys_done=job.keys_done,
            n_keys=job.n_keys,
        ),
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        cancel_requested=job.cancel_requested,
        error=job.error,
        worker_id=job.worker_id if shows_worker else None,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        model_id=job.model_id,
        model_url=model_url(job.model_id) if job.model_id else None,
        sweep=None if job.sweep is None else sweep_out(job.sweep),
        split_by=job.split_by,
        small_keys=job.small_keys,
        keyed=None if job.keyed_summary is None else KeyedSummary(**job.keyed_summary),
        warnings=list(job.warnings),
        url=job_url(job.id),
    )


def sweep_out(sweep: dict[str, Any]) -> Sweep:
    """The public view of a k sweep's stored result."""
    return Sweep(
        best_n_components=sweep["best_n_components"],
        models=[
            SweepModel(**entry, model_url=model_url(entry["model_id"])) for entry in sweep["models"]
        ],
    )


def model_summary(model: Model, version: ModelVersion | None = None) -> ModelSummary:
    """A model as listed; ``version`` is the registered version it is, if any."""
    return ModelSummary(
        id=model.id,
        name=model.name,
        registered_model=None if version is None else version.registered_model,
        version=None if version is None else version.version,
        algorithm=model.algorithm,
        n_components=model.n_components,
        n_features=model.n_features,
        train_min_loss=model.train_min_loss,
        holdout_min_loss=model.holdout_min_loss,
        beats_baseline=beats_baseline(
            train_min_loss=model.train_min_loss,
            holdout_min_loss=model.holdout_min_loss,
            baseline=model.baseline,
        ),
        converged=model.converged,
        log_likelihood=model.log_likelihood,
        bic=model.bic,
        n_parameters=model.n_parameters,
        warnings=list(model.warnings),
        split_by=model.split_by,
        dataset_id=model.dataset_id,
        job_id=model.job_id,
        created_at=model.created_at,
        url=model_url(model.id),
    )


def model_out(model: Model, version: ModelVersion | None = None) -> ModelOut:
    """The full public view of a model: its θ list, scores, baseline and provenance."""
    uncertainty = model.uncertainty
    estimates = [None] * model.n_components if uncertainty is None else uncertainty["components"]
    components = [
        Component(
            coef=list(coef),
            intercept=intercept,
            share=share,
            estimates=None if estimate is None else ComponentEstimates.model_validate(estimate),
        )
        for coef, intercept, share, estimate in zip(
            model.coef, model.intercept, model.shares, estimates, strict=True
        )
    ]
    return ModelOut(
        **model_summary(model, version).model_dump(),
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
        candidates=(
            None
            if model.candidates is None
            else [Candidate.model_validate(item) for item in model.candidates]
        ),
        weights=model.weights_column,
        groups=model.groups_column,
        group_metrics=(
            None
            if model.group_metrics is None
            else GroupMetrics.model_validate(model.group_metrics)
        ),
        uncertainty=None if uncertainty is None else Uncertainty.model_validate(uncertainty),
        gate=None if model.gate is None else GateOut.model_validate(model.gate),
        keyed=None if model.keyed_summary is None else KeyedSummary(**model.keyed_summary),
    )
