"""Limits on what one request may make the server do, each a setting named in its refusal.

Strings have fixed bounds in the schemas (``MAX_TEXT_LENGTH``); counts that decide the cost of
a fit or an upload are checked here against ``Settings``: data too large is a 413, a parameter
asking for too much work a 422, and more unfinished jobs than a key may have a 429.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from models_store import jobs as job_store
from service.config import Settings
from service.errors import DataTooLargeError, LimitExceededError, TooManyJobsError
from service.fit_schemas import FitVariant
from service.schemas import MAX_TEXT_LENGTH

RETRY_AFTER_S = 5
"""What a client told to wait for its jobs (429) is asked to wait before it tries again."""


@dataclass(frozen=True)
class _Limit:
    setting: str

    @property
    def variable(self) -> str:
        return f"MIXREG_{self.setting.upper()}"

    def value(self, settings: Settings) -> Any:
        return getattr(settings, self.setting)


# Algorithm parameters bounded by a setting (a parameter the algorithm lacks is not checked).
PARAMETER_LIMITS = {
    "n_partitions": _Limit("max_n_partitions"),
    "subsample_size": _Limit("max_subsample_size"),
    "max_iter": _Limit("max_iterations"),
    "n_init": _Limit("max_n_init"),
}
_ROWS = _Limit("max_rows")
_FEATURES = _Limit("max_features")
_K = _Limit("max_k")
_K_SWEEP = _Limit("max_k_sweep")
_TIME_BUDGET = _Limit("max_time_budget_s")
_BOOTSTRAP = _Limit("max_n_bootstrap")
_QUEUED_JOBS = _Limit("max_queued_jobs_per_key")
_PREDICT_VALUES = _Limit("max_predict_values")


TIME_LIMIT_MARGIN = 0.1
"""The part of ``MIXREG_JOB_TIME_LIMIT_S`` no time budget may use: what a fit does after its
budget (the polish of its best candidate, the baseline, the scores) and the storing of its
models must fit in it."""


def largest_total_budget_s(settings: Settings) -> float:
    """The most seconds of time budget one job may ask for, all its k together."""
    return (1 - TIME_LIMIT_MARGIN) * settings.job_time_limit_s


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _above(loc: list[str | int], value: float, limit: _Limit, settings: Settings) -> dict[str, Any]:
    """A validation error (as in ``errors[]`` of a 422) for ``value`` above ``limit``."""
    location = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
    maximum = limit.value(settings)
    return {
        "loc": ["body", *loc],
        "msg": f"{location.lstrip('.')} = {_number(value)} is above the limit of "
        f"{_number(maximum)} ({limit.variable})",
        "type": "limit_exceeded",
    }


# A k list with more values above the limit than this is told as a count, not value by value.
MAX_K_VALUES_LISTED = 3


def _k_values_above(k: list[int], settings: Settings) -> list[dict[str, Any]]:
    """The errors of a k list's values above the limit: one per value for a few, else one that
    counts them (a sweep of 1-500 must not answer with 400 sentences)."""
    above = [(index, value) for index, value in enumerate(k) if value > settings.max_k]
    if len(above) <= MAX_K_VALUES_LISTED:
        return [_above(["k", index], value, _K, settings) for index, value in above]
    (first, first_value), (last, last_value) = above[0], above[-1]
    return [
        {
            "loc": ["body", "k"],
            "msg": f"k[{first}] = {first_value} … k[{last}] = {last_value}: {len(above)} values "
            f"are above the limit of {settings.max_k} ({_K.variable})",
            "type": "limit_exceeded",
        }
    ]


def check_data_shape(
    n_rows: int, n_features: int | None, *, settings: Settings, what: str = "the data"
) -> None:
    """Raise ``DataTooLargeError`` (413) if ``what`` has more rows or features than allowed."""
    problems = []
    if n_rows > settings.max_rows:
        problems.append(
            f"{what} has {n_rows:,} rows; at most {settings.max_rows:,} are accepted "
            f"({_ROWS.variable})"
        )
    if n_features is not None and n_features > settings.max_features:
        problems.append(
            f"{what} has {n_features:,} features; at most {settings.max_features:,} are "
            f"accepted ({_FEATURES.variable})"
        )
    if problems:
        raise DataTooLargeError("; ".join(problems))


def check_imported_shape(n_components: int, n_features: int, *, settings: Settings) -> None:
    """Raise ``LimitExceededError`` (422) if an imported model has more lines or features than
    a fit may have: a model is served the same way whether it was fitted here or imported."""
    if n_components > settings.max_k:
        raise LimitExceededError(
            f"n_components: the model has {n_components:,} lines; at most {settings.max_k:,} "
            f"are accepted ({_K.variable})"
        )
    if n_features > settings.max_features:
        raise LimitExceededError(
            f"n_features: the model has {n_features:,} features; at most "
            f"{settings.max_features:,} are accepted ({_FEATURES.variable})"
        )


def check_answer_size(
    n_rows: int,
    n_components: int,
    *,
    settings: Settings,
    matrices: Sequence[str] = ("predictions",),
    vectors: Sequence[str] = (),
) -> None:
    """Raise ``DataTooLargeError`` (413) if the answer to ``n_rows`` rows of a model of
    ``n_components`` lines would hold more values than allowed.

    Every output of the answer counts: ``matrices`` are its (rows, k) outputs (the
    predictions, a gated model's probabilities, the group posteriors), ``vectors`` its
    outputs of one value per row (the expected and most likely values, a group's line, ...).
    """
    per_row = len(matrices) * n_components + len(vectors)
    n_values = n_rows * per_row
    maximum = settings.max_predict_values
    if n_values <= maximum:
        return
    if list(matrices) == ["predictions"] and not vectors:
        held = f"{n_values:,} predictions ({n_rows:,} rows x k = {n_components})"
    else:
        parts = []
        if matrices:
            parts.append(f"k = {n_components} for each of {', '.join(matrices)}")
        if vectors:
            parts.append(f"1 for each of {', '.join(vectors)}")
        held = f"{n_values:,} values ({n_rows:,} rows x ({' + '.join(parts)}))"
    raise DataTooLargeError(
        f"the answer would hold {held}; at most {maximum:,} are answered "
        f"({_PREDICT_VALUES.variable}); send at most {max(1, maximum // max(1, per_row)):,} "
        f"rows per request"
    )


def check_names(names: list[str], *, field: str) -> None:
    """Raise ``LimitExceededError`` if a name (of a CSV column, say) is longer than allowed."""
    for index, name in enumerate(names):
        if len(name) > MAX_TEXT_LENGTH:
            where = f"{field}[{index}]" if len(names) > 1 or field == "feature_names" else field
            raise LimitExceededError(
                f"{where} has {len(name):,} characters; a name may have at most {MAX_TEXT_LENGTH}"
            )


def check_upload_names(
    *,
    name: str | None,
    feature_names: list[str],
    target_name: str | None,
    kept: Sequence[str] = (),
) -> None:
    """Raise ``LimitExceededError`` if an upload's name, a column name, the target name or the
    name of a kept column is longer than a name may be (a JSON body's are bounded by its schema
    already)."""
    if name is not None:
        check_names([name], field="name")
    check_names(feature_names, field="feature_names")
    if target_name is not None:
        check_names([target_name], field="target")
    check_names(list(kept), field="keep")


def check_fit_request(
    request: FitVariant, *, data_shape: tuple[int, int] | None, settings: Settings
) -> None:
    """Raise if a fit asks for more than the limits: 413 for inline data of ``data_shape``
    (rows, features), else 422 listing every parameter above its limit."""
    if data_shape is not None:
        check_data_shape(*data_shape, settings=settings, what="data.X")
    errors: list[dict[str, Any]] = []
    k = request.n_components
    if isinstance(k, list) and len(k) > settings.max_k_sweep:
        errors.append(
            {
                "loc": ["body", "k"],
                "msg": f"k lists {len(k)} values; a sweep fits at most {settings.max_k_sweep} "
                f"({_K_SWEEP.variable}); split it into several jobs",
                "type": "limit_exceeded",
            }
        )
    if isinstance(k, list):
        errors.extend(_k_values_above(k, settings))
    elif k > settings.max_k:
        errors.append(_above(["k"], k, _K, settings))
    for parameter, limit in PARAMETER_LIMITS.items():
        value = getattr(request.params, parameter, None)
        if isinstance(value, int) and value > limit.value(settings):
            errors.append(_above(["params", parameter], value, limit, settings))
    if request.n_bootstrap > settings.max_n_bootstrap:
        errors.append(_above(["n_bootstrap"], request.n_bootstrap, _BOOTSTRAP, settings))
    budget = request.time_budget_s
    if budget is not None and budget > settings.max_time_budget_s:
        errors.append(_above(["time_budget_s"], budget, _TIME_BUDGET, settings))
    elif budget is not None:
        errors.extend(_over_time_limit(budget, len(k) if isinstance(k, list) else 1, settings))
    if errors:
        raise LimitExceededError("; ".join(error["msg"] for error in errors), errors=errors)


def _over_time_limit(budget: float, n_k: int, settings: Settings) -> list[dict[str, Any]]:
    """An error if ``budget`` for each of ``n_k`` values of k would not end before the job time
    limit stops the job (its data loading does not count)."""
    total, largest = budget * n_k, largest_total_budget_s(settings)
    if total < largest:
        return []
    asked = (
        f"time_budget_s = {_number(budget)}"
        if n_k == 1
        else f"time_budget_s = {_number(budget)} for each of the {n_k} values of k adds up to "
        f"{_number(total)} s, which"
    )
    return [
        {
            "loc": ["body", "time_budget_s"],
            "msg": f"{asked} would not end before the job time limit: a job's budgets must "
            f"add up to less than {_number(largest)} s ({1 - TIME_LIMIT_MARGIN:.0%} of "
            f"MIXREG_JOB_TIME_LIMIT_S = {_number(settings.job_time_limit_s)}); lower it"
            + (" or split the sweep" if n_k > 1 else ""),
            "type": "limit_exceeded",
        }
    ]


def check_job_quota(session: Session, *, api_key_id: str | None, settings: Settings) -> None:
    """Raise ``TooManyJobsError`` (429) if the key already has as many unfinished jobs as it
    may (without keys, all jobs count together)."""
    unfinished = job_store.count_unfinished_jobs(session, api_key_id=api_key_id)
    maximum = settings.max_queued_jobs_per_key
    if unfinished >= maximum:
        owner = f"API key {api_key_id}" if api_key_id is not None else "this server"
        raise TooManyJobsError(
            f"{owner} has {unfinished} jobs queued or running, the most allowed "
            f"({_QUEUED_JOBS.variable} = {maximum}); retry once some have finished",
            retry_after_s=RETRY_AFTER_S,
        )


def check_fit_admission(
    session: Session,
    *,
    request: FitVariant,
    data_shape: tuple[int, int] | None,
    idempotency_key: str | None,
    api_key_id: str | None,
    settings: Settings,
) -> None:
    """Raise unless a fit may be queued: its parameters and data within the limits, and its key
    below its number of unfinished jobs (a retry of a job already queued is always answered).

    The quota's lock is taken first and held until the request's transaction ends, when the
    new job is committed: concurrent fits of one key are counted one after the other.
    """
    check_fit_request(request, data_shape=data_shape, settings=settings)
    job_store.lock_job_quota(session, api_key_id=api_key_id)
    replay = idempotency_key is not None and (
        job_store.get_job_by_idempotency_key(session, api_key_id=api_key_id, key=idempotency_key)
        is not None
    )
    if not replay:
        check_job_quota(session, api_key_id=api_key_id, settings=settings)
