"""Submitting fits: validate everything ``mixreg`` would reject, then queue the job."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mixreg.service_support import check_n_components_list
from models_store import datasets as dataset_store
from models_store import jobs as job_store
from models_store.tables import Dataset, Job
from service import checks
from service.data import columns, ingest, model_references
from service.data.json_bodies import ValidationErrors, located_in_the_body
from service.errors import ConflictError, InvalidInputError, NotFoundError
from service.fit_schemas import FitRequest, FitVariant
from service.jobs.fit_columns import check_fit_columns, wanted_columns
from service.jobs.fit_memory import check_fit_memory
from service.jobs.fit_spec import FitSpec, gating_of, holdout_size


@dataclass(frozen=True)
class Submission:
    """The job of a fit request; ``created`` is False when an idempotent retry found it."""

    job: Job
    created: bool


def request_hash(request: FitVariant) -> str:
    """SHA-256 of the validated request with its defaults, so equivalent bodies match."""
    canonical = json.dumps(
        request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), allow_nan=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class PreparedFit:
    """A fit request ready to submit: its hash as sent, and its inline data (if any) as arrays,
    with the request's own rows emptied (the arrays hold the same numbers in a fraction of the
    memory, and they cross a process boundary cheaply)."""

    request: FitVariant
    digest: str
    data: ingest.ParsedDataset | None

    @property
    def data_shape(self) -> tuple[int, int] | None:
        """Rows and features of the inline data; None for a stored dataset."""
        if self.data is None:
            return None
        n_rows, n_features = self.data.X.shape
        return n_rows, n_features


def prepare_fit(request: FitVariant) -> PreparedFit:
    """Hash ``request`` and convert its inline data to arrays; raise ``InvalidInputError``
    for rows that cannot be fitted. Pure CPU work on the request alone: a big body's runs in a
    child process (``service.data.json_bodies``)."""
    digest = request_hash(request)
    if request.data is None:
        return PreparedFit(request=request, digest=digest, data=None)
    data = request.data
    try:
        parsed = ingest.parse_arrays(data.X, data.y, data.feature_names)
    except checks.IngestError as exc:
        raise InvalidInputError(str(exc)) from None
    emptied = request.model_copy(update={"data": data.model_copy(update={"X": [], "y": []})})
    return PreparedFit(request=emptied, digest=digest, data=parsed)


def fit_spec(request: FitVariant) -> FitSpec:
    """The fit a request describes; a list of k makes it a k sweep."""
    k = request.n_components
    return FitSpec(
        algorithm=request.algorithm,
        n_components=max(k) if isinstance(k, list) else k,
        k_values=tuple(k) if isinstance(k, list) else None,
        params=request.params_dict,
        fit_intercept=request.fit_intercept,
        holdout_fraction=request.holdout_fraction,
        seed=request.seed,
        time_budget_s=request.time_budget_s,
        weights_column=request.weights,
        groups_column=request.groups,
        standard_errors=request.wants_standard_errors,
        n_bootstrap=request.n_bootstrap,
        bootstrap=request.bootstrap,
        gating=gating_of(request.gating),
    )


def check_sweep_size(spec: FitSpec, *, max_k_sweep: int) -> None:
    """Raise ``InvalidInputError`` if the k sweep lists more k than one job may fit."""
    if spec.k_values is not None and len(spec.k_values) > max_k_sweep:
        raise InvalidInputError(
            f"k lists {len(spec.k_values)} values; a sweep fits at most {max_k_sweep} "
            f"(MIXREG_MAX_K_SWEEP); split it into several jobs"
        )


def too_few_training_rows(spec: FitSpec, k: int, *, n_rows: int) -> str:
    """Why ``k`` lines cannot be fitted to the training rows, and what to change."""
    n_holdout = holdout_size(n_rows, spec.holdout_fraction)
    n_train = n_rows - n_holdout
    if n_holdout == 0:
        return f"k={k} is more than the {n_rows} rows: fit at most k={n_rows}, or add rows"
    return (
        f"k={k} is more than the {n_train} training rows: holdout_fraction="
        f"{spec.holdout_fraction:g} holds out {n_holdout} of the {n_rows} rows; lower k to at "
        f"most {n_train}, lower holdout_fraction (0 trains on every row), or add rows"
    )


def check_fit(spec: FitSpec, *, n_rows: int, n_features: int) -> dict[str, Any]:
    """Raise ``InvalidInputError`` for anything the fit of ``n_rows`` rows would fail on.

    Returns the parameters to store on the job: with their size-aware defaults resolved for a
    single k, as requested for a k sweep (where such a default differs per k).
    """
    n_train = n_rows - holdout_size(n_rows, spec.holdout_fraction)
    if n_train < 1:
        raise InvalidInputError(
            f"holdout_fraction={spec.holdout_fraction} holds out all {n_rows} rows; "
            f"lower it so that at least one row trains"
        )
    if spec.k_values is not None and spec.params.get("init") is not None:
        raise InvalidInputError(
            "params.init gives the starting lines of one k; it cannot be used with a list of k"
        )
    largest_k = max(spec.k_values or (spec.n_components,))
    if largest_k > n_train:
        raise InvalidInputError(too_few_training_rows(spec, largest_k, n_rows=n_rows))
    if spec.k_values is not None:
        try:
            check_n_components_list(spec.k_values, n_train, n_features + bool(spec.fit_intercept))
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
    resolved: dict[str, Any] = {}
    # Each k's resolution is one pass of bounded cost (a few milliseconds at the limits, even
    # counting the partitions of the largest sub-sample): it runs in the request's thread.
    for k in spec.k_values or (spec.n_components,):
        try:
            resolved = spec.estimator(k).resolved_parameters(n_train, n_features)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
    if spec.k_values is not None:
        return dict(spec.params)
    # The time budget is the job's own column, not an algorithm parameter.
    resolved.pop("time_budget", None)
    return resolved


def _replay(job: Job, digest: str, key: str) -> Submission:
    if job.request_hash != digest:
        raise ConflictError(
            f"Idempotency-Key '{key}' was already used for a different request (job {job.id}); "
            f"use a new key for a new request"
        )
    return Submission(job=job, created=False)


def submit_fit(
    session: Session,
    *,
    fit: PreparedFit,
    idempotency_key: str | None,
    max_attempts: int,
    max_k_sweep: int,
    api_key_id: str | None = None,
    enqueue: Callable[[Session, str], object] | None = None,
    fit_memory_bytes: int | None = None,
) -> Submission:
    """Queue the fit ``fit`` (storing inline data as a dataset first) in ``session``.

    The same ``idempotency_key`` from the same caller (``api_key_id``; callers without a key
    share one scope) with the same request returns the existing job; with a different request
    it is a conflict. Another caller's key of the same name is another key. Nothing is written
    if the request is rejected.
    A k sweep may list at most ``max_k_sweep`` values of k. ``enqueue(session, job_id)``, if
    given, hands a new job to a task queue in the same transaction (Procrastinate's defer), so
    the job and its task are committed together or not at all. A fit whose quadratic arrays
    need more than ``fit_memory_bytes`` is refused (``service.jobs.fit_memory``).
    """
    request = fit.request
    spec = fit_spec(request)
    check_sweep_size(spec, max_k_sweep=max_k_sweep)
    digest = fit.digest
    if idempotency_key is not None:
        existing = job_store.get_job_by_idempotency_key(
            session, api_key_id=api_key_id, key=idempotency_key
        )
        if existing is not None:
            return _replay(existing, digest, idempotency_key)
    parsed = fit.data
    wanted = wanted_columns(request.weights, request.groups)
    if parsed is not None:
        if wanted:
            raise InvalidInputError(
                f"{' and '.join(wanted)} name columns of a stored dataset; inline data carry "
                f"no extra columns: upload the rows with their columns (POST /datasets, keep="
                f"{','.join(wanted.values())}) and fit by dataset_id"
            )
        n_rows, n_features = parsed.X.shape
        feature_names = parsed.feature_names
    else:
        assert request.dataset_id is not None  # the schema requires one of the two
        dataset = _existing_dataset(session, request.dataset_id)
        n_rows, n_features = dataset.n_rows, dataset.n_features
        feature_names = list(dataset.feature_names)
        check_fit_columns(dataset, wanted)
        if spec.concomitant_names is not None:
            check_concomitant_columns(dataset, spec.concomitant_names)
    if request.init_model is not None:
        spec = warm_start(session, spec, request.init_model, feature_names=feature_names)
    params = check_fit(spec, n_rows=n_rows, n_features=n_features)
    check_fit_memory(spec, n_features=n_features, fit_memory_bytes=fit_memory_bytes)
    if request.split_by is not None:
        check_key_column(dataset, request.split_by)
    try:
        # A savepoint: a concurrent request with the same key wins the unique constraint, and
        # this one's dataset and job are undone together.
        with session.begin_nested():
            dataset_id = request.dataset_id
            if parsed is not None:
                dataset_id = dataset_store.create_dataset(
                    session,
                    X=parsed.X,
                    y=parsed.y,
                    feature_names=parsed.feature_names,
                    target_name=None,
                    name=request.name,
                ).id
            assert dataset_id is not None
            job = job_store.create_job(
                session,
                job_store.JobRecord(
                    dataset_id=dataset_id,
                    algorithm=spec.algorithm,
                    n_components=spec.n_components,
                    k_values=spec.k_values,
                    params=params,
                    fit_intercept=spec.fit_intercept,
                    holdout_fraction=spec.holdout_fraction,
                    seed=spec.seed,
                    time_budget_s=spec.time_budget_s,
                    name=request.name,
                    api_key_id=api_key_id,
                    idempotency_key=idempotency_key,
                    request_hash=digest,
                    max_attempts=max_attempts,
                    registered_model=request.registered_model,
                    discard_data=not request.keep_data,
                    weights_column=spec.weights_column,
                    groups_column=spec.groups_column,
                    uncertainty=spec.uncertainty,
                    gating=spec.gating,
                    split_by=request.split_by,
                    small_keys=request.small_keys if request.split_by is not None else None,
                    keys_per_shard=request.keys_per_shard if request.split_by is not None else None,
                ),
            )
            if enqueue is not None:
                enqueue(session, job.id)
    except IntegrityError:
        if idempotency_key is None:
            raise
        winner = job_store.get_job_by_idempotency_key(
            session, api_key_id=api_key_id, key=idempotency_key
        )
        if winner is None:
            raise
        return _replay(winner, digest, idempotency_key)
    return Submission(job=job, created=True)


WARM_STARTED_ALGORITHMS = ("auto", "am", "am-classic", "em")
"""The algorithms that take starting lines (``init_model``)."""


def warm_start(
    session: Session, spec: FitSpec, reference: str, *, feature_names: Sequence[str] | None
) -> FitSpec:
    """``spec`` starting from the lines of the model ``reference`` names; 404 if it names
    none, 422 if its features, k or intercept differ from the fit's.

    ``feature_names`` are the names of the data to fit (None: ``x0, x1, ...``).
    """
    what = f"init_model {reference}"
    if spec.algorithm not in WARM_STARTED_ALGORITHMS:
        raise InvalidInputError(
            f"{what}: algorithm {spec.algorithm} takes no starting lines; use one of "
            f"{', '.join(WARM_STARTED_ALGORITHMS)}"
        )
    if spec.k_values is not None:
        raise InvalidInputError(f"{what} gives the starting lines of one k; k must be one number")
    if spec.params.get("init") is not None:
        raise InvalidInputError(f"{what} and params.init both give starting lines; give one")
    model = model_references.get_model(session, reference)
    names = list(feature_names) if feature_names is not None else None
    if names is None:
        names = [f"x{j}" for j in range(model.n_features)]
    if list(model.feature_names) != names:
        raise InvalidInputError(
            f"{what} was fitted on the features {_listed(model.feature_names)}, but the data "
            f"has {_listed(names)}; a warm start needs the same features in the same order"
        )
    if model.n_components != spec.n_components:
        raise InvalidInputError(
            f"{what} has k={model.n_components} lines, but the fit asks for k="
            f"{spec.n_components}; ask for k={model.n_components}"
        )
    if model.fit_intercept != spec.fit_intercept:
        raise InvalidInputError(
            f"{what} was fitted with fit_intercept={str(model.fit_intercept).lower()}; fit with "
            f"the same"
        )
    lines = [
        [*coef, intercept] if model.fit_intercept else list(coef)
        for coef, intercept in zip(model.coef, model.intercept, strict=True)
    ]
    return replace(spec, params={**spec.params, "init": lines})


def check_concomitant_columns(dataset: Dataset, names: Sequence[str]) -> None:
    """Raise ``InvalidInputError`` (422) naming the first of the gate's columns that the dataset
    does not keep or that holds text; a missing number fails the job
    (``service.jobs.fit_columns.check_concomitant_values``)."""
    fields = {f"gating[{position}]": name for position, name in enumerate(names)}
    columns.check_columns(dataset, fields, {field: {columns.NUMBER} for field in fields})


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"[{shown}] ({len(names)})"


def check_key_column(dataset: Dataset, name: str) -> None:
    """Raise ``InvalidInputError`` naming ``split_by`` unless ``name`` is a kept column of
    ``dataset``; keys that are numbers but not integers fail the job
    (``service.jobs.fit_columns.check_integer_keys``)."""
    columns.check_columns(dataset, {"split_by": name})


def _existing_dataset(session: Session, dataset_id: str) -> Dataset:
    # Locked against deletion until the job that fits it is committed.
    dataset = dataset_store.lock_dataset(session, dataset_id=dataset_id, shared=True)
    if dataset is None:
        raise NotFoundError(f"dataset {dataset_id} does not exist")
    return dataset


_FIT_REQUEST: TypeAdapter[FitVariant] = TypeAdapter(FitRequest)


def parse_fit_body(body: bytes) -> PreparedFit | ValidationErrors:
    """Validate a JSON fit body and prepare it (:func:`prepare_fit`: its hash, and its inline
    rows as arrays; raises ``InvalidInputError`` for rows that cannot be fitted). Big bodies
    are parsed in a child process (:func:`service.data.json_bodies.in_a_child`)."""
    try:
        request = _FIT_REQUEST.validate_json(body)
    except ValidationError as exc:
        return located_in_the_body(exc)
    return prepare_fit(request)
