"""The one implementation of every operation, shared by the sync and async clients.

Each operation is a generator that yields what it needs done — a :class:`Call` (an HTTP
request) or a :class:`Sleep` — and receives the response; it builds the requests, parses the
answers and raises :class:`MixregError` for problems. The sync client drives it with
``httpx.Client`` and ``time.sleep``, the async client with ``httpx.AsyncClient`` and
``asyncio.sleep``, so the two cannot drift apart.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
import numpy as np
from numpy.typing import NDArray

from mixreg_client import _data
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

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
URL_VARIABLE = "MIXREG_URL"
HOST_VARIABLE = "MIXREG_HOST"
PORT_VARIABLE = "MIXREG_PORT"
API_KEY_VARIABLE = "MIXREG_API_KEY"
# A server bound to every interface is reached on this machine through the loopback address.
EVERY_INTERFACE = ("0.0.0.0", "::", "")
PAGE_SIZE = 500
# Waits between retries of a request that did not reach the server (seconds).
RETRY_BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class Call:
    """One HTTP request to send; ``retry`` says it is safe to send again after a lost
    connection (reads, and writes made idempotent by their ``Idempotency-Key``)."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    files: dict[str, tuple[str, bytes, str]] | None = None
    data: dict[str, str | list[str]] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    retry: bool = True

    def options(self) -> dict[str, Any]:
        """Keyword arguments of ``httpx.Client.request``."""
        options: dict[str, Any] = {"headers": self.headers}
        for name in ("params", "json", "files", "data"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        return options


@dataclass(frozen=True)
class Sleep:
    """Wait this many seconds before going on."""

    seconds: float


Step = Call | Sleep
Operation = Generator[Step, httpx.Response | None, T]
ProgressCallback = Callable[[Job], object]


def resolve_base_url(base_url: str | None) -> str:
    """The server's address, no trailing slash: ``base_url``, else ``MIXREG_URL``, else
    ``http://MIXREG_HOST:MIXREG_PORT`` (the address ``mixreg serve`` binds, each part
    defaulting to 127.0.0.1 and 8000)."""
    url = base_url or os.environ.get(URL_VARIABLE)
    if not url:
        host = os.environ.get(HOST_VARIABLE, DEFAULT_HOST).strip()
        if host in EVERY_INTERFACE:
            host = DEFAULT_HOST
        if ":" in host:
            host = f"[{host}]"
        port = os.environ.get(PORT_VARIABLE, "").strip() or str(DEFAULT_PORT)
        if not port.isdigit():
            raise ValueError(f"{PORT_VARIABLE}={port!r} is not a port number")
        url = f"http://{host}:{port}"
    return url.rstrip("/")


def resolve_api_key(api_key: str | None) -> str | None:
    """``api_key``, else ``MIXREG_API_KEY``, else none."""
    return api_key or os.environ.get(API_KEY_VARIABLE) or None


def default_headers(api_key: str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    """Headers of every request: the API key as a bearer token, and the caller's own."""
    result = {"Accept": "application/json, application/problem+json"}
    if api_key:
        result["Authorization"] = f"Bearer {api_key}"
    result.update(headers or {})
    return result


def retry_delays(retries: int) -> list[float]:
    """The waits before each of ``retries`` retries."""
    return [RETRY_BACKOFF_S[min(index, len(RETRY_BACKOFF_S) - 1)] for index in range(retries)]


def _response(received: httpx.Response | None) -> httpx.Response:
    assert received is not None, "a Call is always answered with its response"
    return received


def _json(response: httpx.Response) -> Any:
    """The JSON of a successful response; a problem raises :class:`MixregError`."""
    if not response.is_success:
        raise MixregError.from_response(response)
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        raise MixregError(
            f"{response.request.method} {response.request.url.path} answered "
            f"{response.status_code} with a body that is not JSON",
            status=response.status_code,
            title=response.reason_phrase,
        ) from None


def _content(response: httpx.Response) -> bytes:
    if not response.is_success:
        raise MixregError.from_response(response)
    return response.content


def _idempotency_key() -> dict[str, str]:
    # One key per logical request: its retries reuse it, so the server runs it once.
    return {"Idempotency-Key": uuid.uuid4().hex}


def _id_of(item: str | Dataset | Job | Model | ModelSummary) -> str:
    return item if isinstance(item, str) else item.id


def _paged(path: str, params: dict[str, Any], limit: int | None) -> Operation[list[Any]]:
    """Every item of a paginated list (or the first ``limit``), page after page by the
    server's cursor, so items added meanwhile never make it skip or repeat one."""
    items: list[Any] = []
    cursor: str | None = None
    while limit is None or len(items) < limit:
        size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(items))
        query = {**params, "limit": size}
        if cursor is not None:
            query["cursor"] = cursor
        page = _json(_response((yield Call("GET", path, params=query))))
        items.extend(page["items"])
        cursor = page.get("next_cursor")
        if cursor is None or not page["items"]:
            break
    return items


# --- datasets ---


def upload(
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
) -> Operation[Dataset]:
    """Store a dataset (see :meth:`mixreg_client.Client.upload`)."""
    chosen = _data.Columns(
        features=features,
        ignore=tuple(ignore or ()),
        delimiter=delimiter,
        keep=tuple(keep or ()),
        na=_data.check_na(na),
    )
    file = _data.upload_of(
        data, y, target=target, feature_names=feature_names, name=name, chosen=chosen
    )
    call = Call(
        "POST",
        "/datasets",
        files={"file": (file.filename, file.content, file.media_type)},
        data=file.fields,
        headers=_idempotency_key(),
    )
    dataset = Dataset.from_json(_json(_response((yield call))))
    if file.dropped_rows:
        # Rows of a DataFrame or Parquet file are left out here, before they are sent.
        dataset = replace(dataset, dropped_rows={**dataset.dropped_rows, **file.dropped_rows})
    return dataset


def get_dataset(dataset_id: str) -> Operation[Dataset]:
    """One dataset."""
    return Dataset.from_json(_json(_response((yield Call("GET", f"/datasets/{dataset_id}")))))


def list_datasets(limit: int | None) -> Operation[list[Dataset]]:
    """Datasets, newest first."""
    items = yield from _paged("/datasets", {}, limit)
    return [Dataset.from_json(item) for item in items]


# --- fits and jobs ---


def fit(
    dataset: str | Dataset,
    *,
    k: int | Sequence[int],
    algorithm: str,
    params: Mapping[str, Any] | None,
    fit_intercept: bool,
    holdout_fraction: float,
    seed: int,
    time_budget_s: float | None,
    name: str | None,
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
) -> Operation[Job]:
    """Queue a fit of a stored dataset; the job as accepted."""
    body: dict[str, Any] = {
        "dataset_id": _id_of(dataset),
        "k": k if isinstance(k, int) else list(k),
        "algorithm": algorithm,
        "fit_intercept": fit_intercept,
        "holdout_fraction": holdout_fraction,
        "seed": seed,
    }
    # Only what differs from the server's defaults, which a server before them also takes.
    if standard_errors is not None:
        body["standard_errors"] = standard_errors
    if n_bootstrap:
        body |= {"n_bootstrap": n_bootstrap, "bootstrap": bootstrap}
    if params:
        body["params"] = dict(params)
    if time_budget_s is not None:
        body["time_budget_s"] = time_budget_s
    if name is not None:
        body["name"] = name
    if registered_model is not None:
        body["registered_model"] = registered_model
    if init_model is not None:
        body["init_model"] = init_model
    if weights is not None:
        body["weights"] = weights
    if groups is not None:
        body["groups"] = groups
    if gating is not None:
        body["gating"] = gating if isinstance(gating, str) else list(gating)
    if split_by is not None:
        body["split_by"] = split_by
    if small_keys is not None:
        body["small_keys"] = small_keys
    accepted = _json(_response((yield Call("POST", "/fit", json=body, headers=_idempotency_key()))))
    return (yield from get_job(accepted["job_id"]))


def get_job(job_id: str) -> Operation[Job]:
    """A job's state now."""
    return Job.from_json(_json(_response((yield Call("GET", f"/jobs/{job_id}")))))


def list_jobs(status: str | None, limit: int | None) -> Operation[list[Job]]:
    """Jobs, newest first."""
    params = {} if status is None else {"status": status}
    items = yield from _paged("/jobs", params, limit)
    return [Job.from_json(item) for item in items]


def cancel_job(job_id: str) -> Operation[Job]:
    """Ask for a job to stop; a job that already finished is returned as it is."""
    response = _response((yield Call("POST", f"/jobs/{job_id}/cancel")))
    if response.status_code == 409:
        # Finished meanwhile: nothing to cancel, which is what the caller wanted.
        return (yield from get_job(job_id))
    return Job.from_json(_json(response))


def wait(
    job_id: str,
    *,
    progress: ProgressCallback | None,
    timeout: float | None,
    poll_interval: float,
) -> Operation[Job]:
    """Poll a job until it finishes; ``progress`` sees every state read on the way."""
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    while True:
        job = yield from get_job(job_id)
        if progress is not None:
            progress(job)
        if job.done:
            return job
        if time.monotonic() >= deadline:
            raise TimeoutError(f"job {job_id} is still {job.status} after {timeout:g} s")
        yield Sleep(min(poll_interval, max(deadline - time.monotonic(), 0.0)))


def sweep(job_id: str) -> Operation[Sweep | None]:
    """A k sweep's models and scores (None for a single k, or before it succeeded)."""
    job = yield from get_job(job_id)
    return job.sweep


def job_model(job_id: str) -> Operation[Model]:
    """The model a succeeded job produced (of a k sweep: the k BIC prefers)."""
    job = yield from get_job(job_id)
    if job.model_id is None:
        why = f": {job.error}" if job.error else ""
        raise MixregError(f"job {job_id} has no model: it is {job.status}{why}", title="No model")
    return (yield from get_model(job.model_id))


# --- models ---


def get_model(model_id: str) -> Operation[Model]:
    """A model's lines, scores and provenance."""
    return Model.from_json(_json(_response((yield Call("GET", f"/models/{model_id}")))))


def list_models(limit: int | None) -> Operation[list[ModelSummary]]:
    """Models, newest first."""
    items = yield from _paged("/models", {}, limit)
    return [ModelSummary.from_json(item) for item in items]


def delete_model(model_id: str) -> Operation[None]:
    """Delete a model."""
    _json(_response((yield Call("DELETE", f"/models/{model_id}"))))


def _rows_in_model_order(model: str | Model | ModelSummary, X: Any) -> Operation[Any]:
    """``X``; a DataFrame's columns matched to the model's features by name."""
    if not _data.is_dataframe(X):
        return X
    fitted = model if isinstance(model, Model) else (yield from get_model(_id_of(model)))
    return _data.columns_in_model_order(X, fitted.feature_names)


# Rows per predict request: the server parses a JSON predict body of at most 8 MiB by
# default (MIXREG_MAX_PREDICT_JSON_BYTES); a row of d numbers takes about 20 (d + 2) bytes.
PREDICT_BODY_BYTES = 4_000_000


def row_batches(n_rows: int, n_features: int) -> list[slice]:
    """Consecutive slices of ``n_rows`` rows, each a predict body of about
    :data:`PREDICT_BODY_BYTES` at most (one slice for no rows)."""
    per_batch = max(1, PREDICT_BODY_BYTES // (20 * (n_features + 2)))
    return [slice(start, start + per_batch) for start in range(0, max(n_rows, 1), per_batch)]


def predict(
    model: str | Model | ModelSummary,
    X: Any,
    keys: Sequence[str | int] | None = None,
    unknown_keys: str | None = None,
) -> Operation[np.ndarray]:
    """k values per row, shape ``(n, k)``; of a keyed model, each row by its key's lines.
    Many rows go in several requests (:func:`row_batches`)."""
    rows = yield from _rows_in_model_order(model, X)
    matrix = _data.feature_matrix(rows)
    key_list = None if keys is None else [key if isinstance(key, str) else int(key) for key in keys]
    parts = []
    for batch in row_batches(len(matrix), len(matrix[0]) if matrix else 0):
        body: dict[str, Any] = {"X": matrix[batch]}
        if key_list is not None:
            body["keys"] = key_list[batch]
        if unknown_keys is not None:
            body["unknown_keys"] = unknown_keys
        call = Call("POST", f"/models/{_id_of(model)}/predict", json=body)
        answer = _json(_response((yield call)))
        parts.append(np.asarray(answer["predictions"], dtype=np.float64))
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def predict_groups(
    model: str | Model | ModelSummary, X: Any, groups: Any
) -> Operation[GroupPredictions]:
    """k values per row, the line of each row's group and its posterior."""
    rows = yield from _rows_in_model_order(model, X)
    body = {"X": _data.feature_matrix(rows), "groups": np.asarray(groups).tolist()}
    answer = _json(_response((yield Call("POST", f"/models/{_id_of(model)}/predict", json=body))))
    predictions = np.asarray(answer["predictions"], dtype=np.float64)
    return GroupPredictions(
        predictions=predictions,
        group_line=np.asarray(answer["group_line"], dtype=np.int64),
        group_posterior=_group_posterior(answer, n_components=predictions.shape[1]),
    )


def _group_posterior(answer: dict[str, Any], n_components: int) -> NDArray[np.float64]:
    """The answer's group posteriors, a NaN row for each null (a group the fit never saw)."""
    posterior = np.full((len(answer["group_line"]), n_components), np.nan)
    seen = np.asarray(answer["group_line"]) >= 0
    posterior[seen] = [row for row in answer["group_posterior"] if row is not None]
    return posterior


def predict_gated(
    model: str | Model | ModelSummary, X: Any, concomitant: Any
) -> Operation[GatedPredictions]:
    """A gated model's k values per row with its probabilities and what they choose."""
    rows = yield from _rows_in_model_order(model, X)
    body: dict[str, Any] = {"X": _data.feature_matrix(rows)}
    if concomitant is not None:
        body["concomitant"] = _data.concomitant_values(concomitant)
    answer = _json(_response((yield Call("POST", f"/models/{_id_of(model)}/predict", json=body))))
    if "probabilities" not in answer:
        raise ValueError(f"model {_id_of(model)} has no gate; use predict")
    return GatedPredictions(
        predictions=np.asarray(answer["predictions"], dtype=np.float64),
        probabilities=np.asarray(answer["probabilities"], dtype=np.float64),
        expected=np.asarray(answer["expected"], dtype=np.float64),
        most_likely=np.asarray(answer["most_likely"], dtype=np.float64),
        most_likely_component=np.asarray(answer["most_likely_component"], dtype=np.int64),
    )


def score(model: str | Model | ModelSummary, X: Any, y: Any) -> Operation[Scores]:
    """Predictions with the min-loss and each row's best line (many rows in several requests,
    their min-loss the mean over all rows)."""
    targets = _data.target_vector(y)
    rows = yield from _rows_in_model_order(model, X)
    matrix = _data.feature_matrix(rows)
    predictions, best, total_loss = [], [], 0.0
    for batch in row_batches(len(matrix), len(matrix[0]) if matrix else 0):
        batch_rows = matrix[batch]
        body = {"X": batch_rows, "y": targets[batch]}
        call = Call("POST", f"/models/{_id_of(model)}/predict", json=body)
        answer = _json(_response((yield call)))
        predictions.append(np.asarray(answer["predictions"], dtype=np.float64))
        best.append(np.asarray(answer["best_component"], dtype=np.int64))
        total_loss += float(answer["min_loss"]) * len(batch_rows)
    return Scores(
        predictions=predictions[0] if len(predictions) == 1 else np.concatenate(predictions),
        y=np.asarray(targets, dtype=np.float64),
        min_loss=total_loss / max(len(matrix), 1),
        best_component=best[0] if len(best) == 1 else np.concatenate(best),
    )


def model_plot(model_id: str) -> Operation[bytes]:
    """The PNG picture of a model's fit."""
    return _content(_response((yield Call("GET", f"/models/{model_id}/plot.png"))))


def sweep_plot(job_id: str) -> Operation[bytes]:
    """The PNG picture of a k sweep: min-loss and BIC against k."""
    return _content(_response((yield Call("GET", f"/jobs/{job_id}/plot.png"))))


# --- registered models ---


def _segment(text: str) -> str:
    # A name or alias is one path segment; quoting keeps a stray '/' or '?' from changing the
    # request (the server then answers that the name does not exist).
    return quote(text, safe="@")


def get_registered_model(name: str) -> Operation[RegisteredModel]:
    """A registered model."""
    call = Call("GET", f"/registered-models/{_segment(name)}")
    return RegisteredModel.from_json(_json(_response((yield call))))


def list_registered_models(limit: int | None) -> Operation[list[RegisteredModel]]:
    """Registered models, with their latest version and aliases."""
    items = yield from _paged("/registered-models", {}, limit)
    return [RegisteredModel.from_json(item) for item in items]


def list_versions(name: str, limit: int | None) -> Operation[list[ModelVersion]]:
    """A registered model's versions, newest first."""
    items = yield from _paged(f"/registered-models/{_segment(name)}/versions", {}, limit)
    return [ModelVersion.from_json(item) for item in items]


def set_alias(name: str, alias: str, version: int) -> Operation[Alias]:
    """Point ``name@alias`` at ``version``."""
    call = Call(
        "PUT",
        f"/registered-models/{_segment(name)}/aliases/{_segment(alias)}",
        json={"version": version},
    )
    return Alias.from_json(_json(_response((yield call))))


def get_alias(name: str, alias: str) -> Operation[Alias]:
    """Where ``name@alias`` points."""
    call = Call("GET", f"/registered-models/{_segment(name)}/aliases/{_segment(alias)}")
    return Alias.from_json(_json(_response((yield call))))
