"""The synchronous client, on ``httpx.Client``."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

import httpx
import numpy as np

from mixreg_client import _core
from mixreg_client._core import Call, Operation, ProgressCallback, Sleep
from mixreg_client._errors import MixregError
from mixreg_client._types import (
    Alias,
    Dataset,
    GatedPredictions,
    GroupPredictions,
    Job,
    Model,
    ModelSummary,
    ModelVersion,
    RegisteredModel,
    Scores,
    Sweep,
)

T = TypeVar("T")


class Client:
    """A client of a mixreg server.

    Parameters
    ----------
    base_url : str, optional
        The server, e.g. ``"http://127.0.0.1:8000"``; default ``MIXREG_URL`` or that address.
    api_key : str, optional
        Sent as ``Authorization: Bearer <key>``; default ``MIXREG_API_KEY``.
    timeout : float
        Seconds to wait for each answer.
    retries : int
        Times a request that did not reach the server (or whose answer was lost) is sent
        again. Every request is safe to repeat: writes carry an ``Idempotency-Key``.
    headers : mapping, optional
        Extra headers for every request.
    transport : httpx transport, optional
        How requests are sent (default: httpx's own), e.g. through a proxy or a test double.

    Every failed request raises :class:`MixregError`, which carries the server's
    problem+json (``status``, ``detail``, ``errors``).

    Examples
    --------
    >>> with Client("http://127.0.0.1:8000") as client:  # doctest: +SKIP
    ...     dataset = client.upload(X, y)
    ...     job = client.fit(dataset, k=2).wait()
    ...     predictions = client.predict(job.model_id, X)  # shape (n, 2)
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = _core.resolve_base_url(base_url)
        self._delays = _core.retry_delays(retries)
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            headers=_core.default_headers(_core.resolve_api_key(api_key), headers),
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def _send(self, call: Call) -> httpx.Response:
        delays = self._delays if call.retry else []
        for attempt in range(len(delays) + 1):
            try:
                return self._http.request(call.method, call.path, **call.options())
            except httpx.TransportError as exc:
                if attempt == len(delays):
                    raise MixregError.unreachable(self.base_url, exc) from exc
                time.sleep(delays[attempt])
        raise AssertionError("unreachable")

    def _drive(self, operation: Operation[T]) -> T:
        try:
            step = next(operation)
            while True:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    step = operation.send(None)
                else:
                    step = operation.send(self._send(step))
        except StopIteration as stop:
            result: T = stop.value
            return result

    # --- datasets ---

    def upload(
        self,
        data: Any,
        y: Any = None,
        *,
        target: str | None = None,
        feature_names: Sequence[str] | None = None,
        name: str | None = None,
        features: Sequence[str] | None = None,
        ignore: Sequence[str] = (),
        delimiter: str | None = None,
        keep: Sequence[str] = (),
        na: str = "error",
    ) -> Dataset:
        """Store a dataset to fit as often as you like.

        Parameters
        ----------
        data : array-like, DataFrame, or path
            The feature matrix ``X`` (n x d, with ``y``); a pandas DataFrame (with
            ``target``); or the path of a ``.csv`` or ``.parquet`` file (with ``target``) or of
            an ``.npz`` archive with arrays ``X`` and ``y``.
        y : array-like, optional
            The n targets, with a matrix ``X``.
        target : str, optional
            The column to predict, for a DataFrame, CSV or Parquet file.
        feature_names : sequence of str, optional
            Names of the columns of ``X`` (default ``x0, x1, ...``).
        name : str, optional
            A name for the dataset.
        features : sequence of str, optional
            A DataFrame's, CSV or Parquet file's feature columns, in this order (default:
            every column but ``target``).
        ignore : sequence of str, optional
            Columns to leave out instead, such as an id or a text column.
        delimiter : str, optional
            What separates a CSV file's fields (default: the one of ``, ; <tab> |`` that its
            header holds most).
        keep : sequence of str, optional
            Columns of a DataFrame, CSV or Parquet file (or arrays of an ``.npz`` archive) kept
            beside the features and the target as extra columns, such as a group id or a
            weight; never features. Numbers stay numbers; any other column is text.
        na : {"error", "drop"}, default "error"
            What a missing feature or target value (an empty CSV cell, a NaN or null) does:
            ``"error"`` refuses the upload naming its column and row; ``"drop"`` leaves its row
            out, and the dataset's ``dropped_rows`` counts them per column.
        """
        return self._drive(
            _core.upload(
                data,
                y,
                target=target,
                feature_names=feature_names,
                name=name,
                features=features,
                ignore=ignore,
                delimiter=delimiter,
                keep=keep,
                na=na,
            )
        )

    def get_dataset(self, dataset_id: str) -> Dataset:
        """One dataset's shape and names."""
        return self._drive(_core.get_dataset(dataset_id))

    def list_datasets(self, *, limit: int | None = None) -> list[Dataset]:
        """Datasets, newest first (all of them, or the first ``limit``)."""
        return self._drive(_core.list_datasets(limit))

    # --- fits and jobs ---

    def fit(
        self,
        dataset: str | Dataset,
        *,
        k: int | Sequence[int],
        algorithm: str = "auto",
        params: Mapping[str, Any] | None = None,
        fit_intercept: bool = True,
        holdout_fraction: float = 0.2,
        seed: int = 0,
        time_budget_s: float | None = None,
        name: str | None = None,
        registered_model: str | None = None,
        init_model: str | None = None,
        weights: str | None = None,
        groups: str | None = None,
        standard_errors: bool | None = None,
        n_bootstrap: int = 0,
        bootstrap: str = "parametric",
        gating: str | Sequence[str] | None = None,
        split_by: str | None = None,
        small_keys: str | None = None,
    ) -> FitJob:
        """Queue a fit of a stored dataset and return its job.

        ``k`` is the number of lines, or a list of them for a k sweep (a model per k; BIC
        picks one). ``algorithm`` and ``params`` are those of ``POST /fit``.
        ``registered_model`` makes the fitted model that name's next version; ``init_model``
        (a model id, ``name@alias`` or ``name/versions/N``) starts the fit from its lines.
        ``weights`` names the dataset's number column of row weights (a weight counts as that
        many copies of the row); ``groups`` its column of group labels (every row of a group
        on one line; algorithms auto, am-classic, em).
        ``standard_errors`` and ``n_bootstrap`` (``bootstrap``: ``"parametric"`` or
        ``"empirical"``) ask for the lines' standard errors (``Model.summary()``; by default the
        server computes them for up to 20,000 training rows).
        ``gating`` fits a gate, mixing probabilities that depend on each row: ``"features"``
        or the names of number columns the dataset kept.
        ``split_by`` (a column kept with the dataset) fits a mixture per key in one job;
        ``small_keys`` ("k1" or "skip") says what keys too small for k lines get.
        """
        job = self._drive(
            _core.fit(
                dataset,
                k=k,
                algorithm=algorithm,
                params=params,
                fit_intercept=fit_intercept,
                holdout_fraction=holdout_fraction,
                seed=seed,
                time_budget_s=time_budget_s,
                name=name,
                registered_model=registered_model,
                init_model=init_model,
                weights=weights,
                groups=groups,
                standard_errors=standard_errors,
                n_bootstrap=n_bootstrap,
                bootstrap=bootstrap,
                gating=gating,
                split_by=split_by,
                small_keys=small_keys,
            )
        )
        return FitJob(self, job)

    def job(self, job_id: str) -> FitJob:
        """A handle on an existing job."""
        return FitJob(self, self.get_job(job_id))

    def get_job(self, job_id: str) -> Job:
        """A job's state now."""
        return self._drive(_core.get_job(job_id))

    def list_jobs(self, *, status: str | None = None, limit: int | None = None) -> list[Job]:
        """Jobs, newest first; ``status`` keeps only jobs in that state."""
        return self._drive(_core.list_jobs(status, limit))

    def cancel_job(self, job_id: str) -> Job:
        """Cancel a job (a finished job is returned as it is)."""
        return self._drive(_core.cancel_job(job_id))

    def sweep(self, job_id: str) -> Sweep | None:
        """A k sweep's models and scores per k; None for a single k or an unfinished job."""
        return self._drive(_core.sweep(job_id))

    # --- models ---

    def list_models(self, *, limit: int | None = None) -> list[ModelSummary]:
        """Models, newest first (all of them, or the first ``limit``)."""
        return self._drive(_core.list_models(limit))

    def get_model(self, model_id: str) -> Model:
        """A model's lines, scores and provenance."""
        return self._drive(_core.get_model(model_id))

    def delete_model(self, model_id: str) -> None:
        """Delete a model."""
        self._drive(_core.delete_model(model_id))

    @overload
    def predict(
        self,
        model: str | Model | ModelSummary,
        X: Any,
        groups: None = None,
        *,
        keys: Sequence[str | int] | None = None,
        unknown_keys: str | None = None,
    ) -> np.ndarray: ...

    @overload
    def predict(
        self,
        model: str | Model | ModelSummary,
        X: Any,
        groups: Any,
        *,
        keys: None = None,
        unknown_keys: None = None,
    ) -> GroupPredictions: ...

    def predict(
        self,
        model: str | Model | ModelSummary,
        X: Any,
        groups: Any = None,
        *,
        keys: Sequence[str | int] | None = None,
        unknown_keys: str | None = None,
    ) -> np.ndarray | GroupPredictions:
        """Predictions of every line for every row: an array of shape ``(n, k)``.

        ``X`` is an array of n rows with the model's features in its order, or a DataFrame
        whose columns are matched to the features by name (a missing or unknown column raises
        ValueError). With ``groups`` (one label per row, for a model fitted with groups), a
        :class:`GroupPredictions`: the predictions, the line of each row's group (-1 for a
        group the fit never saw) and its posterior over the lines (a NaN row for an unseen
        group). A keyed model (fitted with ``split_by``) needs each row's key
        in ``keys``; ``unknown_keys`` ("global" or "error") says what a key without lines gets.
        """
        if groups is not None:
            if keys is not None:
                raise ValueError("give groups (a grouped model) or keys (a keyed model), not both")
            return self._drive(_core.predict_groups(model, X, groups))
        return self._drive(_core.predict(model, X, keys, unknown_keys))

    def predict_gated(
        self, model: str | Model | ModelSummary, X: Any, concomitant: Any = None
    ) -> GatedPredictions:
        """A gated model's predictions: the k values, the gate's probabilities, their expected
        value and the most likely line (value and index).

        ``concomitant`` gives the columns the gate reads when they are not the features: rows
        of values in the gate's order, or a DataFrame or mapping of named columns.
        """
        return self._drive(_core.predict_gated(model, X, concomitant))

    def score(self, model: str | Model | ModelSummary, X: Any, y: Any) -> Scores:
        """Predictions of rows with known targets, their min-loss and each row's best line."""
        return self._drive(_core.score(model, X, y))

    # --- registered models ---

    def get_registered_model(self, name: str) -> RegisteredModel:
        """A registered model: its latest version and where its aliases point."""
        return self._drive(_core.get_registered_model(name))

    def list_registered_models(self, *, limit: int | None = None) -> list[RegisteredModel]:
        """The registered models (all, or the first ``limit``): each one's latest version and
        where its aliases point."""
        return self._drive(_core.list_registered_models(limit))

    def list_versions(self, name: str, *, limit: int | None = None) -> list[ModelVersion]:
        """A registered model's versions, newest first (all, or the first ``limit``)."""
        return self._drive(_core.list_versions(name, limit))

    def set_alias(self, name: str, alias: str, version: int) -> Alias:
        """Point ``name@alias`` at ``version`` (creating or moving the alias); every server
        process follows within its alias refresh delay."""
        return self._drive(_core.set_alias(name, alias, version))

    def get_alias(self, name: str, alias: str) -> Alias:
        """Where ``name@alias`` points."""
        return self._drive(_core.get_alias(name, alias))

    def model_plot(self, model_id: str) -> bytes:
        """The PNG picture of a model's fit."""
        return self._drive(_core.model_plot(model_id))

    def sweep_plot(self, job_id: str) -> bytes:
        """The PNG picture of a k sweep (min-loss and BIC against k)."""
        return self._drive(_core.sweep_plot(job_id))


class FitJob:
    """A fit job on the server: wait for it, follow its progress, cancel it."""

    def __init__(self, client: Client, job: Job) -> None:
        self._client = client
        self.id = job.id
        self.last = job
        """The state read most recently."""

    def __repr__(self) -> str:
        return f"FitJob(id={self.id!r}, status={self.last.status!r})"

    def refresh(self) -> Job:
        """Read the job's state now."""
        self.last = self._client.get_job(self.id)
        return self.last

    def wait(
        self,
        progress: ProgressCallback | None = None,
        *,
        timeout: float | None = None,
        poll_interval: float = 0.25,
    ) -> Job:
        """Wait until the job finishes and return its final state (check ``status``).

        ``progress`` is called with each state read (``job.progress.fraction``,
        ``job.progress.best_min_loss``, ...). Raises ``TimeoutError`` after ``timeout``
        seconds.
        """

        def remember(job: Job) -> None:
            self.last = job
            if progress is not None:
                progress(job)

        return self._client._drive(
            _core.wait(self.id, progress=remember, timeout=timeout, poll_interval=poll_interval)
        )

    def cancel(self) -> Job:
        """Ask the server to stop the job (a running fit stops within a second or two)."""
        self.last = self._client.cancel_job(self.id)
        return self.last

    def model(self) -> Model:
        """The model the job produced (of a k sweep: the k BIC prefers)."""
        return self._client._drive(_core.job_model(self.id))

    def sweep(self) -> Sweep | None:
        """A k sweep's models and scores per k."""
        return self._client.sweep(self.id)
