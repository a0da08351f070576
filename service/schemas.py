"""Request and response bodies of the HTTP interface (pydantic v2)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError, PydanticKnownError

from service import checks


def invalid_input(message: str) -> PydanticCustomError:
    """A validation error of type ``invalid_input`` saying ``message``."""
    return PydanticCustomError("invalid_input", message)


def _check_matrix(rows: list[list[float]]) -> list[list[float]]:
    try:
        checks.matrix_from_rows(rows)
    except checks.IngestError as exc:
        raise invalid_input(str(exc)) from None
    return rows


def _check_rows(value: Any) -> Any:
    """A flat list of numbers is a single row that was not wrapped in a list: say so."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(item, int | float) and not isinstance(item, bool) for item in value)
    ):
        shown = ", ".join(repr(item) for item in value[:4]) + (", ..." if len(value) > 4 else "")
        raise invalid_input(
            f"X must be a list of rows, each a list of feature values; to send one row, wrap "
            f"it in a list: [[{shown}]]"
        )
    return value


def _check_text(value: str) -> str:
    try:
        checks.check_text(value)
    except checks.IngestError as exc:
        # Not an "invalid_input" error: the problem detail prefixes the field's location.
        raise PydanticCustomError("invalid_text", str(exc)) from None
    return value


def _check_vector(values: list[float]) -> list[float]:
    try:
        checks.vector_from_values(values)
    except checks.IngestError as exc:
        raise invalid_input(str(exc)) from None
    return values


# NaN and infinity are parsed here (Python's JSON accepts the tokens) so the checks above can
# reject them with the position of the first offending value.
AnyFloat = Annotated[float, Field(allow_inf_nan=True)]
Matrix = Annotated[
    list[list[AnyFloat]],
    BeforeValidator(_check_rows),
    AfterValidator(_check_matrix),
    Field(description="rows of feature values; every row has the same length"),
]
Vector = Annotated[
    list[AnyFloat], AfterValidator(_check_vector), Field(description="one target value per row")
]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
MAX_TEXT_LENGTH = 256
"""The most characters of a name or id in a request (a name is listed with every page)."""


def _check_length(value: str) -> str:
    # After _check_text: pydantic's own max_length refuses unpaired surrogates less precisely.
    if len(value) > MAX_TEXT_LENGTH:
        raise PydanticKnownError("string_too_long", {"max_length": MAX_TEXT_LENGTH})
    return value


# Names and ids are stored as text: no NUL characters or unpaired surrogates, and short.
Text = Annotated[
    str,
    AfterValidator(_check_text),
    AfterValidator(_check_length),
    WithJsonSchema({"type": "string", "maxLength": MAX_TEXT_LENGTH}),
]


def _check_registered_name(value: str) -> str:
    error = checks.name_error(value, what="registered_model")
    if error is not None:
        raise invalid_input(error)
    return value


RegisteredName = Annotated[
    str,
    AfterValidator(_check_registered_name),
    WithJsonSchema({"type": "string", "pattern": f"^{checks.NAME_PATTERN}$"}),
]
# JSON integers only: `true` or `2.0` is not a count.
Count = Annotated[int, Field(strict=True)]


class StrictModel(BaseModel):
    """A body that refuses fields it does not define."""

    model_config = ConfigDict(extra="forbid")


class DataIn(StrictModel):
    """A design matrix with its targets."""

    X: Matrix
    y: Vector
    feature_names: list[Text] | None = Field(
        default=None, description="one name per column of X; default x0, x1, ..."
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> DataIn:
        if len(self.y) != len(self.X):
            raise invalid_input(f"y has {len(self.y)} values but X has {len(self.X)} rows")
        try:
            checks.resolve_feature_names(self.feature_names, len(self.X[0]))
        except checks.IngestError as exc:
            raise invalid_input(str(exc)) from None
        return self


class DatasetIn(DataIn):
    """A dataset uploaded as JSON."""

    name: Text | None = None
    columns: dict[Text, list[AnyFloat | Text | None]] | None = Field(
        default=None,
        description="extra columns kept beside X and y (never features), each one value per "
        "row: all numbers (a number column; null is a missing value, NaN) or all text (a string "
        "column; null is missing), such as a group id or a weight",
    )


class ColumnOut(BaseModel):
    """An extra column of a dataset: its name and type."""

    name: str
    type: Literal["number", "string"] = Field(
        description="number: float64 values, NaN where missing; string: text"
    )


class DatasetOut(BaseModel):
    """A stored dataset."""

    id: str
    name: str | None
    n_rows: int
    n_features: int
    feature_names: list[str]
    target_name: str | None
    columns: list[ColumnOut] = Field(
        description="the extra columns kept beside the features and the target (upload option "
        "keep; JSON columns)"
    )
    dropped_rows: dict[str, int] = Field(
        default_factory=dict,
        description="in the upload's answer: the rows left out by na=drop, per column whose cell "
        "was empty",
    )
    created_at: datetime
    url: str


# --- jobs ---

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class Progress(BaseModel):
    """How far a running fit has come."""

    fraction: float
    iteration: int | None
    candidates_tried: int | None
    best_min_loss: float | None
    n_components: int | None = Field(
        default=None, description="the k being fitted (of a k sweep: its progress is overall)"
    )
    keys_done: int | None = Field(default=None, description="a keyed fit's keys fitted so far")
    n_keys: int | None = Field(default=None, description="a keyed fit's keys in all")


class KeyedSummary(BaseModel):
    """A keyed fit's keys: counts by status, failures and min-loss quantiles."""

    n_keys: int
    n_rows: int = Field(description="rows with a key")
    rows_without_key: int = Field(description="rows whose key is missing or empty, left out")
    keys_by_status: dict[str, int] = Field(
        description="fitted (k lines), k1 (one line: too few rows), skipped (too few rows), failed"
    )
    failures: dict[str, str] = Field(description="why each failed key failed (the first 100)")
    min_loss_quantiles: dict[str, float] = Field(
        description="quantiles q00 (min), q50, q90, q99, q100 (max) of the keys' training min-loss"
    )


class SweepModel(BaseModel):
    """The model of one k in a k sweep, with its scores."""

    n_components: int
    model_id: str
    model_url: str
    train_min_loss: float
    holdout_min_loss: float | None
    log_likelihood: float = Field(description="of the lines as a Gaussian mixture, training rows")
    bic: float = Field(description="Bayesian information criterion; lower is better")
    n_parameters: int
    beats_baseline: bool


class Sweep(BaseModel):
    """The result of a k sweep: a model per k, and the k that BIC prefers."""

    best_n_components: int = Field(description="the k with the lowest BIC (ties: the smaller)")
    models: list[SweepModel]


class JobOut(BaseModel):
    """A fit job and its state."""

    id: str
    status: JobStatus
    name: str | None
    registered_model: str | None = Field(
        default=None, description="the registered model whose next version the fit becomes"
    )
    dataset_id: str
    algorithm: str
    n_components: int = Field(description="k; for a k sweep the largest k of k_values")
    k_values: list[int] | None = Field(description="every k of a k sweep; null for a single k")
    gating: str | list[str] | None = Field(
        default=None,
        description='the gate asked for: null (none), "features" or the dataset\'s columns',
    )
    params: dict[str, Any] = Field(
        description="the algorithm's parameters; for a single k the data-dependent defaults "
        "are resolved (auto's n_init), for a k sweep they stay null and each model records its "
        "own"
    )
    fit_intercept: bool
    holdout_fraction: float
    seed: int | None
    time_budget_s: float | None
    progress: Progress
    attempts: int
    max_attempts: int
    cancel_requested: bool
    error: str | None
    worker_id: str | None = Field(
        description="the worker that runs the job or last ran it (host:pid:random); null "
        "while queued, and for a read-only key"
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    model_id: str | None = Field(description="the model; of a k sweep, the one BIC prefers")
    model_url: str | None
    sweep: Sweep | None = Field(description="a k sweep's models and scores; null for a single k")
    split_by: str | None = Field(default=None, description="a keyed fit's key column")
    small_keys: str | None = Field(default=None, description="what a keyed fit's small keys get")
    keyed: KeyedSummary | None = Field(
        default=None, description="a keyed fit's keys, once it succeeded"
    )
    warnings: list[str] = Field(description="what the fit found poor (the job still succeeds)")
    url: str


# --- health ---


class QueueStatus(BaseModel):
    """The Procrastinate queue of fit tasks (``MIXREG_WORKER=procrastinate``)."""

    workers: int = Field(description="`mixreg worker` processes with a recent heartbeat")
    waiting: int = Field(description="fit tasks waiting for a worker")


class Readiness(BaseModel):
    """The service can serve: its database answers at the newest migration.

    The details (revision, worker mode, queue) are shown to a caller with a key, or, on a
    server without keys, to a client on the server's own machine; others see only the status.
    """

    status: Literal["ready"]
    database_revision: str | None = Field(
        default=None, description="the schema's revision; only in the details"
    )
    worker: Literal["embedded", "procrastinate"] | None = Field(
        default=None,
        description="where fits run: in the API processes or in `mixreg worker` processes; "
        "only in the details",
    )
    queue: QueueStatus | None = Field(
        default=None,
        description="the task queue, with MIXREG_WORKER=procrastinate; null otherwise and "
        "outside the details",
    )


# --- models ---


class Estimate(BaseModel):
    """One parameter of the maximum-likelihood fit with its standard error (a column of R's
    ``summary(refit(m))``); null where a number does not exist (a singular information)."""

    estimate: float
    std_error: float | None
    z_value: float | None = Field(description="estimate / std_error; null for weight and variance")
    p_value: float | None = Field(description="two-sided Pr(>|z|) of the Wald test against 0")
    lower: float | None = Field(description="lower end of the Wald interval (level of the model)")
    upper: float | None
    bootstrap_std_error: float | None = Field(
        default=None, description="the bootstrap's standard deviation, when a bootstrap ran"
    )
    bootstrap_lower: float | None = Field(default=None, description="percentile interval")
    bootstrap_upper: float | None = None


class ComponentEstimates(BaseModel):
    """A line's parameters as the maximum-likelihood fit EM reaches from it estimates them."""

    coef: list[Estimate] = Field(description="one per feature, in the order of feature_names")
    intercept: Estimate | None = Field(description="null without an intercept")
    weight: Estimate = Field(description="the line's mixing weight")
    noise_variance: Estimate
    covariance: list[list[float]] | None = Field(
        default=None,
        description="joint covariance of the line's coefficients then intercept (for "
        "confidence bands); null where the standard errors do not exist",
    )


class BootstrapInfo(BaseModel):
    """The bootstrap behind the ``bootstrap_*`` numbers."""

    kind: Literal["parametric", "empirical"]
    n_bootstrap: int
    n_converged: int = Field(description="replicates whose EM met its tolerance")


class GateEstimates(BaseModel):
    """One row of a gated model's gate (a component other than the reference) with its
    standard errors, as R's ``summary(refit(m))`` lists a concomitant model."""

    component: int = Field(description="the component (1 to k - 1; 0 is the reference)")
    intercept: Estimate
    coef: list[Estimate] = Field(description="one per column the gate reads, in its order")


class Uncertainty(BaseModel):
    """How the standard errors of a model's lines were obtained."""

    method: Literal["observed-information"]
    level: float = Field(description="confidence level of every interval")
    log_likelihood: float | None = Field(description="of the maximum-likelihood fit")
    bootstrap: BootstrapInfo | None
    gate: list[GateEstimates] | None = Field(
        default=None,
        description="a gated model's gate with its standard errors (its lines' weights have "
        "none: they are the gate's mean probabilities); null without a gate",
    )


class Component(BaseModel):
    """One fitted line: y ≈ ⟨coef, x⟩ + intercept, with its share of the training rows."""

    coef: list[float]
    intercept: float
    share: float
    estimates: ComponentEstimates | None = Field(
        default=None,
        description="standard errors, z, p and intervals of the line (standard_errors or "
        "n_bootstrap in the fit); null otherwise",
    )


class Baseline(BaseModel):
    """The single least-squares line on the same split, for comparison."""

    coef: list[float]
    intercept: float
    train_min_loss: float
    holdout_min_loss: float | None


class Candidate(BaseModel):
    """One candidate set of lines tried by ``auto``."""

    source: str = Field(description="where it came from (random start, A3, EM, RANSAC, ...)")
    min_loss_before: float | None = Field(description="training min-loss before the polish")
    min_loss_after: float | None = Field(description="training min-loss after classical AM")
    seconds: float
    n_iter: int
    converged: bool
    n_rows: int = Field(description="rows it was polished on")


class GateHoldout(BaseModel):
    """The gated mixture scored on the holdout rows."""

    log_likelihood: float = Field(description="total log-likelihood of the holdout rows")
    rmse_expected: float = Field(description="RMSE of the gate-weighted expected value")
    rmse_most_likely: float = Field(description="RMSE of the most likely line's value")


class GateOut(BaseModel):
    """The gate of a gated mixture: ``pi_j(z) = softmax_j(<z, coef_j> + intercept_j)``."""

    concomitant: list[str] | None = Field(
        description="the dataset columns the gate reads; null: it reads the features"
    )
    coef: list[list[float]] = Field(
        description="one row per component (the first, the reference, is zero)"
    )
    intercept: list[float]
    noise_variance: list[float] = Field(description="each line's noise variance")
    log_likelihood: float = Field(description="of the gated mixture on the training rows")
    bic: float = Field(description="of the gated mixture; lower is better")
    n_iter: int | None = Field(
        description="iterations of gated EM (null for an imported model that does not say)"
    )
    converged: bool | None
    holdout: GateHoldout | None = Field(description="null without a holdout")


class ModelSummary(BaseModel):
    """A fitted model in a list."""

    id: str
    name: str | None
    registered_model: str | None = Field(
        default=None, description="the registered model this model is a version of, if any"
    )
    version: int | None = Field(default=None, description="its version number, if any")
    algorithm: str
    n_components: int
    n_features: int
    train_min_loss: float
    holdout_min_loss: float | None
    beats_baseline: bool = Field(
        description="its holdout min-loss (training min-loss without a holdout) is below the "
        "one-line least-squares baseline's"
    )
    converged: bool | None = Field(description="null for models stored before it was recorded")
    log_likelihood: float | None = Field(
        description="of the lines as a Gaussian mixture on the training rows"
    )
    bic: float | None = Field(description="Bayesian information criterion; lower is better")
    n_parameters: int | None
    warnings: list[str] = Field(description="what the fit found poor")
    split_by: str | None = Field(
        default=None,
        description="a keyed model's key column: predictions need a key per row "
        "(its lines above are the global model's, for keys it does not know)",
    )
    dataset_id: str
    job_id: str | None
    created_at: datetime
    url: str


class ModelOut(ModelSummary):
    """A fitted model: the θ list and how it was obtained."""

    feature_names: list[str]
    fit_intercept: bool
    components: list[Component]
    baseline: Baseline
    params: dict[str, Any] = Field(description="the parameters the fit ran with, resolved")
    seed: int | None
    n_train: int
    n_holdout: int
    loss_history: list[float]
    n_iter: int
    fit_seconds: float
    candidates: list[Candidate] | None = Field(
        description="every candidate auto tried, in order; null for other algorithms"
    )
    weights: str | None = Field(
        default=None, description="the dataset column of the rows' weights, if the fit used one"
    )
    groups: str | None = Field(
        default=None, description="the dataset column of the rows' groups, if the fit used one"
    )
    group_metrics: GroupMetrics | None = Field(
        default=None, description="a grouped fit's groups and group-level min-losses"
    )
    uncertainty: Uncertainty | None = Field(
        default=None,
        description="how the lines' standard errors were obtained; null when none were",
    )

    gate: GateOut | None = Field(
        default=None, description="the gate of a gated fit; null without one"
    )

    keyed: KeyedSummary | None = Field(default=None, description="a keyed model's keys")


class GroupMetrics(BaseModel):
    """A grouped fit's groups and min-losses at the group level (weighted, with weights)."""

    n_groups_train: int
    n_groups_holdout: int
    train_group_min_loss: float = Field(
        description="each training group on its fitted line: the grouped min-loss the fit minimized"
    )
    holdout_group_min_loss: float | None = Field(
        description="each holdout group (never seen by the fit) on the line that fits its rows "
        "best; null without a holdout"
    )


class KeyLines(BaseModel):
    """One key's lines in a keyed model."""

    model_id: str
    key: str | int
    status: str = Field(description="fitted, k1, skipped or failed")
    n_rows: int
    min_loss: float | None
    components: list[Component]


# --- predict ---


KeyValue = Annotated[int, Field(strict=True, ge=-(2**63), le=2**63 - 1)] | Text


class _PredictBody(StrictModel):
    X: Matrix
    y: Vector | None = Field(default=None, description="if given, also score the predictions")
    groups: list[StrictStr | StrictInt | StrictFloat] | None = Field(
        default=None,
        description="one group label per row, for a model fitted with groups: the answer adds "
        "group_line, the line of each row's group (-1 for a group the fit never saw), and "
        "group_posterior, its posterior over the lines",
    )
    concomitant: Matrix | dict[Text, Vector] | None = Field(
        default=None,
        description="for a model whose gate reads dataset columns: their values, as rows "
        "(one value per column, in the order of the model's gate.concomitant) or as named "
        "columns {name: values}",
    )
    keys: list[KeyValue] | None = Field(
        default=None,
        description="a keyed model (fitted with split_by): each row's key (text or integer); "
        "the row is predicted by its key's lines",
    )
    unknown_keys: Literal["global", "error"] = Field(
        default="global",
        description="a key the keyed model has no lines for (never seen, skipped or failed): "
        "predicted by the global model of all rows, or a 422 naming it",
    )

    @model_validator(mode="after")
    def _check_lengths(self) -> _PredictBody:
        if self.y is not None and len(self.y) != len(self.X):
            raise invalid_input(f"y has {len(self.y)} values but X has {len(self.X)} rows")
        if self.groups is not None and len(self.groups) != len(self.X):
            raise invalid_input(
                f"groups has {len(self.groups)} labels but X has {len(self.X)} rows"
            )
        if isinstance(self.concomitant, list) and len(self.concomitant) != len(self.X):
            raise invalid_input(
                f"concomitant has {len(self.concomitant)} rows but X has {len(self.X)} rows"
            )
        if isinstance(self.concomitant, dict):
            for name, values in self.concomitant.items():
                if len(values) != len(self.X):
                    raise invalid_input(
                        f"concomitant column '{name}' has {len(values)} values but X has "
                        f"{len(self.X)} rows"
                    )
        if self.keys is not None and len(self.keys) != len(self.X):
            raise invalid_input(f"keys has {len(self.keys)} values but X has {len(self.X)} rows")
        return self


class ModelPredictRequest(_PredictBody):
    """Rows to predict with the model named in the path."""


class PredictRequest(_PredictBody):
    """Rows to predict with the model ``model_id``."""

    model_id: Text


class PredictResponse(BaseModel):
    """k predictions per row; with ``y``, also the min-loss and each row's best component."""

    model_id: str = Field(description="the model that answered")
    registered_model: str | None = Field(
        default=None, description="the registered model it is a version of, if any"
    )
    version: int | None = Field(default=None, description="its version, if any")
    predictions: list[list[float]]
    min_loss: float | None = None
    best_component: list[int] | None = None
    group_line: list[int] | None = Field(
        default=None,
        description="with groups: the line of each row's group, -1 for a group the fit never saw",
    )
    group_posterior: list[list[float] | None] | None = Field(
        default=None,
        description="with groups: the posterior over the k lines of each row's group (its "
        "training rows all drawn from one line; kept as float32), null for a group the fit "
        "never saw; for a fit other than em, which keeps no posteriors, the one-hot of the "
        "group's line",
    )
    probabilities: list[list[float]] | None = Field(
        default=None, description="a gated model's mixing probability of each line, per row"
    )
    expected: list[float] | None = Field(
        default=None, description="a gated model's probability-weighted mean of the k values"
    )
    most_likely: list[float] | None = Field(
        default=None, description="a gated model's value of the most likely line"
    )
    most_likely_component: list[int] | None = Field(
        default=None, description="the index of that line"
    )


# --- shared ---

Item = TypeVar("Item", bound=BaseModel)


# The databases store a page's offset as a signed 64-bit integer.
MAX_OFFSET = 2**63 - 1


class Page(BaseModel, Generic[Item]):
    """One page of a list."""

    items: list[Item]
    total: int
    limit: int
    offset: int
    next_cursor: str | None = Field(
        default=None,
        description="pass as cursor to read the next page (null: this is the last); unlike "
        "an offset, it neither skips nor repeats items when new ones arrive meanwhile",
    )


# --- registered models ---


class AliasIn(StrictModel):
    """Where an alias points."""

    version: Count = Field(ge=1, le=999_999_999, description="a version of the registered model")


class AliasOut(BaseModel):
    """An alias and the version it points at."""

    registered_model: str
    alias: str
    version: int
    model_id: str
    previous_version: int | None = Field(
        default=None, description="the version it pointed at before this move (PUT only)"
    )
    updated_at: datetime
    updated_by: str | None = Field(description="id of the API key that moved it last")
    url: str = Field(description="where to predict with it")


class ModelVersionOut(BaseModel):
    """One version of a registered model."""

    registered_model: str
    version: int
    model_id: str
    aliases: list[str] = Field(description="the aliases that point at this version")
    created_at: datetime
    url: str


class RegisteredModelOut(BaseModel):
    """A registered model: its latest version and its aliases."""

    name: str
    latest_version: int = Field(description="the highest version given (0 before the first)")
    aliases: dict[str, int] = Field(description="alias -> version")
    created_at: datetime
    url: str


class AliasEventOut(BaseModel):
    """One move of an alias (the audit trail)."""

    id: int
    alias: str
    from_version: int | None = Field(description="null when the alias was created")
    to_version: int | None = Field(description="null when the alias was removed")
    changed_by: str | None = Field(description="id of the API key that moved it")
    changed_at: datetime


class CursorPage(BaseModel, Generic[Item]):
    """One page of a list read with a cursor: pass ``next_cursor`` as ``cursor`` to read the
    next one (null: this was the last). Rows added meanwhile never make a page skip or repeat
    an item."""

    items: list[Item]
    next_cursor: str | None
