"""Request and response bodies of the HTTP interface (pydantic v2)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError, PydanticKnownError

from mixreg import ALGORITHMS, GROUPED_ALGORITHMS, check_n_components_list
from service.config import MAX_K_SWEEP_LIMIT
from service.data import ingest
from service.errors import ServiceError
from service.serving import references

DEFAULT_ALGORITHM = "auto"


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_input", message)


def _check_matrix(rows: list[list[float]]) -> list[list[float]]:
    try:
        ingest.matrix_from_rows(rows)
    except ingest.IngestError as exc:
        raise _invalid(str(exc)) from None
    return rows


def _check_rows(value: Any) -> Any:
    """A flat list of numbers is a single row that was not wrapped in a list: say so."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(item, int | float) and not isinstance(item, bool) for item in value)
    ):
        shown = ", ".join(repr(item) for item in value[:4]) + (", ..." if len(value) > 4 else "")
        raise _invalid(
            f"X must be a list of rows, each a list of feature values; to send one row, wrap "
            f"it in a list: [[{shown}]]"
        )
    return value


def _check_lines(rows: list[list[float]]) -> list[list[float]]:
    try:
        ingest.matrix_from_rows(rows, name="params.init")
    except ingest.IngestError as exc:
        raise _invalid(str(exc)) from None
    return rows


def _check_text(value: str) -> str:
    try:
        ingest.check_text(value)
    except ingest.IngestError as exc:
        # Not an "invalid_input" error: the problem detail prefixes the field's location.
        raise PydanticCustomError("invalid_text", str(exc)) from None
    return value


def _check_vector(values: list[float]) -> list[float]:
    try:
        ingest.vector_from_values(values)
    except ingest.IngestError as exc:
        raise _invalid(str(exc)) from None
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
    try:
        return references.check_name(value, what="registered_model")
    except ServiceError as exc:
        raise _invalid(exc.detail) from None


RegisteredName = Annotated[
    str,
    AfterValidator(_check_registered_name),
    WithJsonSchema({"type": "string", "pattern": f"^{references.NAME_PATTERN}$"}),
]
# JSON integers only: `true` or `2.0` is not a count.
Count = Annotated[int, Field(strict=True)]


AUTO_STANDARD_ERRORS_MAX_ROWS = 20_000
"""Training rows up to which a fit computes standard errors when not told (they cost an EM
polish and a pass of products over the rows: a small share of a fit of this size, a large one
of a fit of millions)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataIn(_Strict):
    """A design matrix with its targets."""

    X: Matrix
    y: Vector
    feature_names: list[Text] | None = Field(
        default=None, description="one name per column of X; default x0, x1, ..."
    )

    @model_validator(mode="after")
    def _check_shapes(self) -> DataIn:
        if len(self.y) != len(self.X):
            raise _invalid(f"y has {len(self.y)} values but X has {len(self.X)} rows")
        try:
            ingest.resolve_feature_names(self.feature_names, len(self.X[0]))
        except ingest.IngestError as exc:
            raise _invalid(str(exc)) from None
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


# --- algorithm parameters: one model per algorithm, defaults of mixreg.ALGORITHM_PARAMETERS ---

Lines = Annotated[
    list[list[AnyFloat]],
    AfterValidator(_check_lines),
    Field(
        description="starting lines, one row per component: d coefficients, then the intercept "
        "when fit_intercept is true"
    ),
]


def _check_step_size(value: Any) -> float | Literal["auto"]:
    # One validator for both forms, so an error names step_size itself, not a union member.
    if value == "auto" and isinstance(value, str):
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("step_size_type", 'Input should be a positive number or "auto"')
    if not math.isfinite(value):
        raise PydanticKnownError("finite_number")
    if value <= 0:
        raise PydanticKnownError("greater_than", {"gt": 0})
    return float(value)


StepSize = Annotated[
    float | Literal["auto"],
    PlainValidator(
        _check_step_size,
        json_schema_input_type=Annotated[float, Field(gt=0)] | Literal["auto"],
    ),
    Field(
        description='gradient step size: a positive number is the paper\'s gamma; "auto" moves '
        "each line to the point of the span of its whitened gradient and its previous step that "
        "minimizes its objective on its rows"
    ),
]
MaxIter = Annotated[Count, Field(ge=1, description="maximum number of iterations")]
Tol = Annotated[
    float, Field(ge=0, allow_inf_nan=False, description="stop when the loss improves less")
]
NInit = Annotated[Count, Field(ge=1, description="random restarts; the best fit is kept")]
# Every batch of candidate partitions holds one label per sub-sample row: the cap bounds the
# memory of a fit, which is only allocated in the worker.
MAX_SUBSAMPLE_SIZE = 100_000
SubsampleSize = Annotated[
    Count,
    Field(ge=1, le=MAX_SUBSAMPLE_SIZE, description="size of the sub-sample A"),
]
NPartitions = Annotated[Count, Field(ge=1, description="random partitions of A to try")]
Base = Annotated[
    Literal["ls", "ransac"], Field(description="line fit per part: least squares or RANSAC")
]


class AlgorithmParams(_Strict):
    """Parameters of one algorithm; a parameter of another algorithm is rejected."""

    algorithm: ClassVar[str]

    @model_validator(mode="before")
    @classmethod
    def _reject_foreign_parameters(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = list(cls.model_fields)
            for key in data:
                if key not in known:
                    raise PydanticCustomError(
                        "unknown_parameter",
                        "params.{parameter} is not a parameter of algorithm '{algorithm}'; "
                        "its parameters are {known}",
                        {"parameter": key, "algorithm": cls.algorithm, "known": ", ".join(known)},
                    )
        return data


class AutoParams(AlgorithmParams):
    """The best of many: candidates from random starts, the paper's A3, EM restarts and RANSAC,
    each polished by classical AM, then rounds of moves from the best (split a line and free a
    slot, move a line to where the others fit worst, replace a line) and batches of fresh
    starts while they improve it; the lowest training min-loss is kept. The search stops when
    it stops improving, at a cap on its work that grows with the data, or at the job's
    time_budget_s (which replaces the cap)."""

    algorithm: ClassVar[str] = "auto"
    n_init: NInit | None = Field(
        default=None,
        description="random starts of the first round (and of each later batch, at most 20); "
        "default (null): size-aware, from 100 on small data down to 4 on large data",
    )
    init: Lines | None = Field(
        default=None,
        description="one more starting line set (coefficients then intercept per line), "
        "polished and searched beside the others (a warm start)",
    )
    max_iter: MaxIter = Field(
        default=100, description="classical AM iterations of each candidate's polish"
    )
    tol: Tol = 1e-6
    subsample_size: SubsampleSize = 150
    n_partitions: NPartitions = 1000


class AmParams(AlgorithmParams):
    """Gradient alternating minimization (the paper's Algorithm 1)."""

    algorithm: ClassVar[str] = "am"
    step_size: StepSize = "auto"
    max_iter: MaxIter = 100
    tol: Tol = 1e-6
    n_init: NInit = 1
    init: Lines | None = None


class AmClassicParams(AlgorithmParams):
    """Classical alternating minimization: exact least squares per part."""

    algorithm: ClassVar[str] = "am-classic"
    max_iter: MaxIter = 100
    tol: Tol = 1e-6
    n_init: NInit = 1
    init: Lines | None = None


class SubsampleParams(AlgorithmParams):
    """Sub-sampling with random partitions (the paper's Algorithm 3)."""

    algorithm: ClassVar[str] = "subsample"
    subsample_size: SubsampleSize = 150
    n_partitions: NPartitions = 1000
    base: Base = "ls"


class SubsampleExhaustiveParams(AlgorithmParams):
    """Sub-sampling trying every partition of A (the paper's Algorithm 2)."""

    algorithm: ClassVar[str] = "subsample-exhaustive"
    subsample_size: SubsampleSize | None = Field(
        default=None, description="size of A; default: the largest whose partitions fit the cap"
    )
    base: Base = "ls"


class SubsampleAmParams(AlgorithmParams):
    """Algorithm 3 (least squares) as the initialization of Algorithm 1 ("A3")."""

    algorithm: ClassVar[str] = "subsample+am"
    subsample_size: SubsampleSize = 150
    n_partitions: NPartitions = 1000
    base: Base = "ls"
    step_size: StepSize = "auto"
    max_iter: MaxIter = 100
    tol: Tol = 1e-6


class EmParams(AlgorithmParams):
    """Expectation-maximization for a Gaussian mixture of regressions."""

    algorithm: ClassVar[str] = "em"
    max_iter: MaxIter = 200
    tol: Tol = 1e-6
    n_init: NInit = 1
    init: Lines | None = None


PARAMS_MODELS: dict[str, type[AlgorithmParams]] = {
    model.algorithm: model
    for model in (
        AutoParams,
        AmParams,
        AmClassicParams,
        SubsampleParams,
        SubsampleExhaustiveParams,
        SubsampleAmParams,
        EmParams,
    )
}


# --- POST /fit: `algorithm` selects the params schema (a tagged union of whole requests) ---


def _check_n_components(value: Any) -> int | list[int]:
    # One validator for both forms, so an error names k itself, not a union member.
    if isinstance(value, list):
        if len(value) > MAX_K_SWEEP_LIMIT:
            # Checked first: the checks below take time quadratic in the length.
            raise _invalid(
                f"k lists {len(value)} values; a sweep fits at most MIXREG_MAX_K_SWEEP values "
                f"(never more than {MAX_K_SWEEP_LIMIT})"
            )
        try:
            return check_n_components_list(value)
        except ValueError as exc:
            raise _invalid(str(exc)) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError(
            "int_or_list_type", "Input should be an integer or a list of integers"
        )
    if value < 1:
        raise PydanticKnownError("greater_than_equal", {"ge": 1})
    return value


PositiveCount = Annotated[int, Field(ge=1)]
NComponents = Annotated[
    int | list[int],
    PlainValidator(
        _check_n_components,
        json_schema_input_type=PositiveCount
        | Annotated[list[PositiveCount], Field(min_length=1, max_length=MAX_K_SWEEP_LIMIT)],
    ),
]


class _FitBase(_Strict):
    dataset_id: Text | None = Field(default=None, description="a stored dataset to fit")
    data: DataIn | None = Field(default=None, description="inline data, stored as a dataset")
    n_components: NComponents = Field(
        # `k` first: a missing value is reported as `k`, the name users type.
        validation_alias=AliasChoices("k", "n_components"),
        description="k, the number of lines (also accepted as `n_components`); a list of k values "
        "fits one model per k (a k sweep) and prefers the k with the lowest BIC",
    )
    fit_intercept: bool = True
    holdout_fraction: FiniteFloat = Field(
        default=0.2, ge=0, le=0.9, description="share of rows held out to score the model"
    )
    seed: Count = Field(
        default=0, ge=0, le=2**63 - 1, description="seeds the holdout split and the algorithm"
    )
    time_budget_s: FiniteFloat | None = Field(
        default=None, gt=0, description="stop the search after this many seconds"
    )
    name: Text | None = None
    registered_model: RegisteredName | None = Field(
        default=None,
        description="a registered model whose next version (1, 2, 3, ...) the fit becomes; "
        "created by its first fit (of a k sweep, the model of the preferred k)",
    )
    keep_data: bool = Field(
        default=True,
        description="false: delete the inline data once the fit is finished (its model keeps "
        "the lines and the dataset id as provenance)",
    )
    init_model: Text | None = Field(
        default=None,
        description="warm start: a model (id, name@alias or name/versions/N) with the same "
        "features, k and fit_intercept whose lines start the fit (auto: as one candidate "
        "among the others; am, am-classic, em: as their start)",
    )
    weights: Text | None = Field(
        default=None,
        description="a number column of the dataset: each row's weight (a replication weight: "
        "weight 2 counts the row twice; 0 drops it); non-negative, not all zero",
    )
    groups: Text | None = Field(
        default=None,
        description="a column of the dataset (text or numbers) labelling each row's group: "
        "every row of a group is fitted to the same line (algorithms auto, am-classic, em); "
        "the holdout keeps groups whole",
    )

    @model_validator(mode="after")
    def _groups_need_a_grouped_algorithm(self) -> _FitBase:
        if self.groups is not None and self.algorithm not in GROUPED_ALGORITHMS:
            raise _invalid(
                f"groups: algorithm '{self.algorithm}' does not fit groups; use one of "
                f"{', '.join(GROUPED_ALGORITHMS)}"
            )
        if self.groups is not None and "standard_errors" in self.model_fields_set:
            if self.standard_errors or self.n_bootstrap:
                raise _invalid(
                    "standard_errors: standard errors are computed for ungrouped rows only; "
                    "leave out standard_errors and n_bootstrap with groups"
                )
        elif self.groups is not None and self.n_bootstrap:
            raise _invalid("n_bootstrap: the bootstrap is for ungrouped rows only")
        if self.weights is not None and self.n_bootstrap:
            raise _invalid("n_bootstrap: the bootstrap resamples unweighted rows only")
        if self.gating is not None:
            if self.groups is not None:
                raise _invalid("groups: a gated fit takes no groups")
            if self.weights is not None and self.standard_errors:
                raise _invalid(
                    "standard_errors: a gated fit with weights has no standard errors; leave "
                    "out standard_errors or weights"
                )
            if self.n_bootstrap:
                raise _invalid(
                    "n_bootstrap: the bootstrap is for fits without a gate; leave out "
                    "n_bootstrap with gating (standard_errors: true gives the gated fit's)"
                )
        if self.split_by is not None:
            for field in ("groups", "weights", "gating"):
                if getattr(self, field) is not None:
                    raise _invalid(
                        f"{field}: a keyed fit (split_by) takes neither groups, weights nor gating"
                    )
            if self.n_bootstrap or (
                "standard_errors" in self.model_fields_set and self.standard_errors
            ):
                raise _invalid(
                    "standard_errors: a keyed fit (split_by) computes no standard errors; leave "
                    "out standard_errors and n_bootstrap"
                )
        return self

    @property
    def wants_standard_errors(self) -> bool | None:
        """``standard_errors`` as asked (None: by the size of the training rows), except for
        grouped rows and keyed fits: never (they are for one ungrouped mixture); and a gated
        fit computes them only when asked (``true``)."""
        if self.groups is not None or self.split_by is not None:
            return False
        if self.gating is not None:
            return bool(self.standard_errors)
        return self.standard_errors

    standard_errors: bool | None = Field(
        default=None,
        description="per line (ungrouped fits), standard errors, z values, p values "
        "and 95 % intervals of the coefficients, weight and noise variance, from the observed "
        "information of the Gaussian mixture at the maximum-likelihood fit EM reaches from the "
        "fitted lines (as R's flexmix::refit); for a gated fit, of its lines, noise variances "
        "and gate (uncertainty.gate), at the gated mixture's maximum. null (the default): "
        f"computed when the training rows number at most {AUTO_STANDARD_ERRORS_MAX_ROWS:,}, "
        "where they cost a small share of the fit (never for a gated fit); true or false: "
        "always or never",
    )
    n_bootstrap: Count = Field(
        default=0,
        ge=0,
        description="bootstrap replicates (0: none; at most MIXREG_MAX_N_BOOTSTRAP): each "
        "refitted by EM from the maximum-likelihood fit and matched to its lines, for "
        "bootstrap standard errors and percentile intervals",
    )
    bootstrap: Literal["parametric", "empirical"] = Field(
        default="parametric",
        description="parametric: new targets drawn from the fitted mixture at the same rows; "
        "empirical: rows drawn with replacement",
    )
    gating: Literal["features"] | Annotated[list[Text], Field(min_length=1)] | None = Field(
        default=None,
        description="mixing probabilities that depend on each row (a multinomial-logit gate, "
        'as flexmix\'s FLXPmultinom): null for none, "features" to gate on the features, or '
        "the names of number columns the dataset kept at upload; the algorithm's lines start EM "
        "for the gated mixture",
    )
    split_by: Text | None = Field(
        default=None,
        description="a keyed fit: the name of a kept column of the stored dataset (text or "
        "integer keys, e.g. an account); one mixture of k lines is fitted per key, all in one "
        "job, plus the global model of all rows (with `algorithm`) for keys it does not know",
    )
    keys_per_shard: int = Field(
        default=65_536,
        ge=1,
        le=1_000_000,
        strict=True,
        description="a keyed fit fits and stores its keys this many at a time: a worker lost "
        "mid-fit loses only the shard it was fitting, which the next attempt fits again",
    )
    small_keys: Literal["k1", "skip"] = Field(
        default="k1",
        description="a keyed fit's keys with fewer rows than k lines need (k * (d + 1)): one "
        "least-squares line (k1), or skipped (predicted by the global model)",
    )

    @model_validator(mode="after")
    def _one_data_source(self) -> _FitBase:
        if (self.dataset_id is None) == (self.data is None):
            raise _invalid("give exactly one of dataset_id or data")
        if isinstance(self.gating, list):
            if self.data is not None:
                raise _invalid(
                    "gating names columns, but inline data have no extra columns: upload the "
                    "dataset with its columns (POST /datasets, keep=...) and fit its dataset_id"
                )
            repeated = sorted({name for name in self.gating if self.gating.count(name) > 1})
            if repeated:
                raise _invalid(f"gating names the column '{repeated[0]}' more than once")
        if self.split_by is not None and self.dataset_id is None:
            raise _invalid(
                "split_by names a column of a stored dataset: upload the data with its key "
                "column kept (POST /datasets with keep=...) and fit its dataset_id"
            )
        if self.split_by is not None and isinstance(self.n_components, list):
            raise _invalid("split_by fits one k per key; k must be one number")
        if not self.keep_data and self.data is None:
            raise _invalid(
                "keep_data: false applies to inline data; a stored dataset is deleted with "
                "DELETE /datasets/{dataset_id}"
            )
        return self

    # Narrowed by each variant to its algorithm's name and parameters.
    algorithm: str
    params: AlgorithmParams

    @property
    def params_dict(self) -> dict[str, Any]:
        """The validated algorithm parameters including defaults."""
        return self.params.model_dump(mode="json")


class AutoFit(_FitBase):
    algorithm: Literal["auto"] = "auto"
    params: AutoParams = Field(default_factory=AutoParams)


class AmFit(_FitBase):
    algorithm: Literal["am"]
    params: AmParams = Field(default_factory=AmParams)


class AmClassicFit(_FitBase):
    algorithm: Literal["am-classic"]
    params: AmClassicParams = Field(default_factory=AmClassicParams)


class SubsampleFit(_FitBase):
    algorithm: Literal["subsample"]
    params: SubsampleParams = Field(default_factory=SubsampleParams)


class SubsampleExhaustiveFit(_FitBase):
    algorithm: Literal["subsample-exhaustive"]
    params: SubsampleExhaustiveParams = Field(default_factory=SubsampleExhaustiveParams)


class SubsampleAmFit(_FitBase):
    algorithm: Literal["subsample+am"]
    params: SubsampleAmParams = Field(default_factory=SubsampleAmParams)


class EmFit(_FitBase):
    algorithm: Literal["em"]
    params: EmParams = Field(default_factory=EmParams)


def _check_algorithm(value: Any) -> Any:
    """Name an unknown algorithm precisely, and make the default (``auto``) explicit so the
    union can be discriminated by the ``algorithm`` property."""
    if not isinstance(value, dict | _FitBase):
        raise _invalid("the fit request must be a JSON object")
    if isinstance(value, dict):
        algorithm = value.get("algorithm", DEFAULT_ALGORITHM)
        if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
            raise PydanticCustomError(
                "unknown_algorithm",
                "algorithm {algorithm} is unknown; choose one of {choices}",
                {"algorithm": repr(algorithm), "choices": ", ".join(ALGORITHMS)},
            )
        return {**value, "algorithm": algorithm}
    return value


# Discriminated by the property `algorithm` (an OpenAPI discriminator with a mapping); the
# validator before it fills in the default and names an unknown algorithm.
FitRequest = Annotated[
    AutoFit | AmFit | AmClassicFit | SubsampleFit | SubsampleExhaustiveFit | SubsampleAmFit | EmFit,
    Discriminator("algorithm"),
    BeforeValidator(_check_algorithm),
]
FitVariant = (
    AutoFit | AmFit | AmClassicFit | SubsampleFit | SubsampleExhaustiveFit | SubsampleAmFit | EmFit
)


class FitAccepted(BaseModel):
    """A fit job was accepted (or an identical earlier request found)."""

    job_id: str
    status: str
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


class _PredictBody(_Strict):
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
            raise _invalid(f"y has {len(self.y)} values but X has {len(self.X)} rows")
        if self.groups is not None and len(self.groups) != len(self.X):
            raise _invalid(f"groups has {len(self.groups)} labels but X has {len(self.X)} rows")
        if isinstance(self.concomitant, list) and len(self.concomitant) != len(self.X):
            raise _invalid(
                f"concomitant has {len(self.concomitant)} rows but X has {len(self.X)} rows"
            )
        if isinstance(self.concomitant, dict):
            for name, values in self.concomitant.items():
                if len(values) != len(self.X):
                    raise _invalid(
                        f"concomitant column '{name}' has {len(values)} values but X has "
                        f"{len(self.X)} rows"
                    )
        if self.keys is not None and len(self.keys) != len(self.X):
            raise _invalid(f"keys has {len(self.keys)} values but X has {len(self.X)} rows")
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


class AliasIn(_Strict):
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
