"""The body of ``POST /fit`` (pydantic v2): one request schema per algorithm, discriminated by
``algorithm``, each with its own parameters (defaults of :data:`mixreg.ALGORITHM_PARAMETERS`),
and the answer that a fit was accepted. The bodies shared with the other resources (inline
data, text, counts) are :mod:`service.schemas`'."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    PlainValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError, PydanticKnownError

from mixreg import ALGORITHMS, GROUPED_ALGORITHMS
from mixreg.service_support import check_n_components_list
from service import checks
from service.config import MAX_K_SWEEP_LIMIT
from service.schemas import (
    AnyFloat,
    Count,
    DataIn,
    FiniteFloat,
    RegisteredName,
    StrictModel,
    Text,
    invalid_input,
)

DEFAULT_ALGORITHM = "auto"

AUTO_STANDARD_ERRORS_MAX_ROWS = 20_000
"""Training rows up to which a fit computes standard errors when not told (they cost an EM
polish and a pass of products over the rows: a small share of a fit of this size, a large one
of a fit of millions)."""


def _check_lines(rows: list[list[float]]) -> list[list[float]]:
    try:
        checks.matrix_from_rows(rows, name="params.init")
    except checks.IngestError as exc:
        raise invalid_input(str(exc)) from None
    return rows


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


class AlgorithmParams(StrictModel):
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
            raise invalid_input(
                f"k lists {len(value)} values; a sweep fits at most MIXREG_MAX_K_SWEEP values "
                f"(never more than {MAX_K_SWEEP_LIMIT})"
            )
        try:
            return check_n_components_list(value)
        except ValueError as exc:
            raise invalid_input(str(exc)) from None
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


class _FitBase(StrictModel):
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
            raise invalid_input(
                f"groups: algorithm '{self.algorithm}' does not fit groups; use one of "
                f"{', '.join(GROUPED_ALGORITHMS)}"
            )
        if self.groups is not None and "standard_errors" in self.model_fields_set:
            if self.standard_errors or self.n_bootstrap:
                raise invalid_input(
                    "standard_errors: standard errors are computed for ungrouped rows only; "
                    "leave out standard_errors and n_bootstrap with groups"
                )
        elif self.groups is not None and self.n_bootstrap:
            raise invalid_input("n_bootstrap: the bootstrap is for ungrouped rows only")
        if self.weights is not None and self.n_bootstrap:
            raise invalid_input("n_bootstrap: the bootstrap resamples unweighted rows only")
        if self.gating is not None:
            if self.groups is not None:
                raise invalid_input("groups: a gated fit takes no groups")
            if self.weights is not None and self.standard_errors:
                raise invalid_input(
                    "standard_errors: a gated fit with weights has no standard errors; leave "
                    "out standard_errors or weights"
                )
            if self.n_bootstrap:
                raise invalid_input(
                    "n_bootstrap: the bootstrap is for fits without a gate; leave out "
                    "n_bootstrap with gating (standard_errors: true gives the gated fit's)"
                )
        if self.split_by is not None:
            for field in ("groups", "weights", "gating"):
                if getattr(self, field) is not None:
                    raise invalid_input(
                        f"{field}: a keyed fit (split_by) takes neither groups, weights nor gating"
                    )
            if self.n_bootstrap or (
                "standard_errors" in self.model_fields_set and self.standard_errors
            ):
                raise invalid_input(
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
            raise invalid_input("give exactly one of dataset_id or data")
        if isinstance(self.gating, list):
            if self.data is not None:
                raise invalid_input(
                    "gating names columns, but inline data have no extra columns: upload the "
                    "dataset with its columns (POST /datasets, keep=...) and fit its dataset_id"
                )
            repeated = sorted({name for name in self.gating if self.gating.count(name) > 1})
            if repeated:
                raise invalid_input(f"gating names the column '{repeated[0]}' more than once")
        if self.split_by is not None and self.dataset_id is None:
            raise invalid_input(
                "split_by names a column of a stored dataset: upload the data with its key "
                "column kept (POST /datasets with keep=...) and fit its dataset_id"
            )
        if self.split_by is not None and isinstance(self.n_components, list):
            raise invalid_input("split_by fits one k per key; k must be one number")
        if not self.keep_data and self.data is None:
            raise invalid_input(
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
        raise invalid_input("the fit request must be a JSON object")
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
