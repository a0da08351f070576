"""What the server answers, as typed, read-only records (each keeps the whole JSON in ``raw``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
TERMINAL_STATUSES: tuple[str, ...] = ("succeeded", "failed", "cancelled")


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class Dataset:
    """A stored dataset: its shape and names (not its values)."""

    id: str
    name: str | None
    n_rows: int
    n_features: int
    feature_names: list[str]
    target_name: str | None
    created_at: str
    raw: dict[str, Any] = field(repr=False, compare=False)
    columns: dict[str, str] = field(default_factory=dict)
    """The extra columns kept beside the features and the target: name -> ``"number"`` or
    ``"string"``."""
    dropped_rows: dict[str, int] = field(default_factory=dict)
    """Of an upload with ``na="drop"``: the rows left out, per column whose value was
    missing."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Dataset:
        """Read the server's JSON."""
        return cls(
            id=data["id"],
            name=data.get("name"),
            n_rows=int(data["n_rows"]),
            n_features=int(data["n_features"]),
            feature_names=list(data["feature_names"]),
            target_name=data.get("target_name"),
            columns={column["name"]: column["type"] for column in data.get("columns", [])},
            dropped_rows={
                str(column): int(count) for column, count in data.get("dropped_rows", {}).items()
            },
            created_at=data["created_at"],
            raw=data,
        )


@dataclass(frozen=True)
class Progress:
    """How far a fit has come."""

    fraction: float
    iteration: int | None
    candidates_tried: int | None
    best_min_loss: float | None
    n_components: int | None
    keys_done: int | None = None
    """A keyed fit's keys fitted so far (None for other fits)."""
    n_keys: int | None = None
    """A keyed fit's keys in all, once counted (None for other fits)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Progress:
        """Read the server's JSON."""
        return cls(
            fraction=float(data["fraction"]),
            iteration=_optional_int(data.get("iteration")),
            candidates_tried=_optional_int(data.get("candidates_tried")),
            best_min_loss=_optional_float(data.get("best_min_loss")),
            n_components=_optional_int(data.get("n_components")),
            keys_done=_optional_int(data.get("keys_done")),
            n_keys=_optional_int(data.get("n_keys")),
        )


@dataclass(frozen=True)
class KeyedSummary:
    """A keyed fit's keys: how many, their rows, their counts by status (``fitted``, ``k1``,
    ``skipped``, ``failed``), why failed keys failed and quantiles of their min-loss."""

    n_keys: int
    n_rows: int
    rows_without_key: int
    keys_by_status: dict[str, int]
    failures: dict[str, str]
    min_loss_quantiles: dict[str, float]

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> KeyedSummary | None:
        """Read the server's JSON (None: not a keyed fit)."""
        if data is None:
            return None
        return cls(
            n_keys=int(data["n_keys"]),
            n_rows=int(data["n_rows"]),
            rows_without_key=int(data["rows_without_key"]),
            keys_by_status={key: int(count) for key, count in data["keys_by_status"].items()},
            failures=dict(data["failures"]),
            min_loss_quantiles={
                name: float(value) for name, value in data["min_loss_quantiles"].items()
            },
        )


@dataclass(frozen=True)
class SweepModel:
    """The model of one k in a k sweep, with its scores."""

    n_components: int
    model_id: str
    train_min_loss: float
    holdout_min_loss: float | None
    log_likelihood: float
    bic: float
    n_parameters: int
    beats_baseline: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepModel:
        """Read the server's JSON."""
        return cls(
            n_components=int(data["n_components"]),
            model_id=data["model_id"],
            train_min_loss=float(data["train_min_loss"]),
            holdout_min_loss=_optional_float(data.get("holdout_min_loss")),
            log_likelihood=float(data["log_likelihood"]),
            bic=float(data["bic"]),
            n_parameters=int(data["n_parameters"]),
            beats_baseline=bool(data["beats_baseline"]),
        )


@dataclass(frozen=True)
class Sweep:
    """A k sweep's result: a model per k, and the k with the lowest BIC."""

    best_n_components: int
    models: list[SweepModel]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sweep:
        """Read the server's JSON."""
        return cls(
            best_n_components=int(data["best_n_components"]),
            models=[SweepModel.from_json(entry) for entry in data["models"]],
        )


@dataclass(frozen=True)
class Job:
    """A fit job's state at the moment it was read."""

    id: str
    status: JobStatus
    name: str | None
    dataset_id: str
    algorithm: str
    n_components: int
    k_values: list[int] | None
    progress: Progress
    attempts: int
    error: str | None
    model_id: str | None
    sweep: Sweep | None
    warnings: list[str]
    created_at: str
    started_at: str | None
    finished_at: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    split_by: str | None = None
    """A keyed fit's key column (None for other fits)."""
    keyed: KeyedSummary | None = None
    """A keyed fit's keys, once it succeeded."""

    @property
    def done(self) -> bool:
        """The job has finished: succeeded, failed or cancelled."""
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        """Read the server's JSON."""
        sweep = data.get("sweep")
        k_values = data.get("k_values")
        return cls(
            id=data["id"],
            status=data["status"],
            name=data.get("name"),
            dataset_id=data["dataset_id"],
            algorithm=data["algorithm"],
            n_components=int(data["n_components"]),
            k_values=None if k_values is None else [int(k) for k in k_values],
            progress=Progress.from_json(data["progress"]),
            attempts=int(data["attempts"]),
            error=data.get("error"),
            model_id=data.get("model_id"),
            sweep=None if sweep is None else Sweep.from_json(sweep),
            warnings=list(data.get("warnings") or []),
            created_at=data["created_at"],
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            raw=data,
            split_by=data.get("split_by"),
            keyed=KeyedSummary.from_json(data.get("keyed")),
        )


@dataclass(frozen=True)
class Component:
    """One fitted line: y ≈ coef · x + intercept, with its share of the training rows."""

    coef: list[float]
    intercept: float
    share: float


@dataclass(frozen=True)
class ModelSummary:
    """A fitted model as listed: its scores, not its lines."""

    id: str
    name: str | None
    registered_model: str | None
    version: int | None
    algorithm: str
    n_components: int
    n_features: int
    train_min_loss: float
    holdout_min_loss: float | None
    beats_baseline: bool
    converged: bool | None
    bic: float | None
    warnings: list[str]
    dataset_id: str
    job_id: str | None
    created_at: str
    raw: dict[str, Any] = field(repr=False, compare=False)
    split_by: str | None = None
    """A keyed model's key column: predictions need a key per row (its lines are the global
    model's, for keys it does not know); None for other models."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSummary:
        """Read the server's JSON."""
        return cls(**_summary_fields(data), raw=data)


def _summary_fields(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": data["id"],
        "name": data.get("name"),
        "registered_model": data.get("registered_model"),
        "version": _optional_int(data.get("version")),
        "algorithm": data["algorithm"],
        "n_components": int(data["n_components"]),
        "n_features": int(data["n_features"]),
        "train_min_loss": float(data["train_min_loss"]),
        "holdout_min_loss": _optional_float(data.get("holdout_min_loss")),
        "beats_baseline": bool(data["beats_baseline"]),
        "converged": data.get("converged"),
        "bic": _optional_float(data.get("bic")),
        "warnings": list(data.get("warnings") or []),
        "dataset_id": data["dataset_id"],
        "job_id": data.get("job_id"),
        "created_at": data["created_at"],
        "split_by": data.get("split_by"),
    }


@dataclass(frozen=True, kw_only=True)
class Model(ModelSummary):
    """A fitted model: its scores and provenance (as listed), and its k lines."""

    feature_names: list[str]
    fit_intercept: bool
    components: list[Component]
    baseline_holdout_min_loss: float | None
    baseline_train_min_loss: float
    params: dict[str, Any]
    seed: int | None
    n_train: int
    n_holdout: int
    gate: dict[str, Any] | None = None
    """A gated model's gate: ``concomitant``, ``coef``, ``intercept``, ``noise_variance``,
    ``log_likelihood``, ``bic`` and the ``holdout`` metrics (None without a gate)."""
    keyed: KeyedSummary | None = None
    """A keyed model's keys: counts by status, failures, min-loss quantiles (None otherwise)."""

    @property
    def gated_bic(self) -> float | None:
        """A gated model's BIC, of its gated mixture (``bic`` is of the lines with constant
        shares); None without a gate."""
        return None if self.gate is None else float(self.gate["bic"])

    @property
    def coef(self) -> NDArray[np.float64]:
        """The coefficients, shape ``(k, n_features)``."""
        return np.array([component.coef for component in self.components], dtype=np.float64)

    @property
    def intercept(self) -> NDArray[np.float64]:
        """The intercepts, shape ``(k,)``."""
        return np.array([component.intercept for component in self.components], dtype=np.float64)

    def summary(self) -> EstimatesTable:
        """Per line, estimate, std. error, z value, Pr(>|z|) and interval of each coefficient,
        intercept, weight and noise variance (as R's ``summary(refit(m))``), and for a gated
        model the gate's intercept and slopes of every component but the first (parameters
        named ``gate:...``); ``print()`` it.

        Raises ValueError if the model was fitted without standard errors.
        """
        uncertainty = self.raw.get("uncertainty")
        if uncertainty is None:
            raise ValueError(
                f"model {self.id} has no standard errors; fit with standard_errors=True"
            )
        rows: list[dict[str, Any]] = []
        for line, component in enumerate(self.raw["components"]):
            estimates = component["estimates"]
            named = [*zip(self.feature_names, estimates["coef"], strict=True)]
            if estimates["intercept"] is not None:
                named.append(("(Intercept)", estimates["intercept"]))
            named += [
                ("weight", estimates["weight"]),
                ("noise_variance", estimates["noise_variance"]),
            ]
            rows += [{"component": line, "parameter": name, **item} for name, item in named]
        # A gated model's gate: components 1..k-1 against the reference, as ``gate:`` rows.
        gate_columns = (self.gate or {}).get("concomitant") or self.feature_names
        for gate_row in uncertainty.get("gate") or []:
            named = [
                ("(Intercept)", gate_row["intercept"]),
                *zip(gate_columns, gate_row["coef"], strict=True),
            ]
            rows += [
                {"component": gate_row["component"], "parameter": f"gate:{name}", **item}
                for name, item in named
            ]
        return EstimatesTable(
            rows=rows, level=float(uncertainty["level"]), note=self._estimates_note(uncertainty)
        )

    def _estimates_note(self, uncertainty: dict[str, Any]) -> str:
        """Which fit the estimates are of: the gated mixture's lines are the lines it serves;
        without a gate, the maximum-likelihood mixture is not the min-loss lines served."""
        if self.gate is not None:
            return "maximum-likelihood estimates of the gated mixture: the lines it serves"
        log_likelihood = uncertainty.get("log_likelihood")
        at = "" if log_likelihood is None else f" (log-likelihood {float(log_likelihood):.6g})"
        return (
            f"maximum-likelihood estimates of the Gaussian mixture{at}, not the served "
            f"min-loss lines"
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Model:
        """Read the server's JSON."""
        baseline = data["baseline"]
        return cls(
            **_summary_fields(data),
            feature_names=list(data["feature_names"]),
            fit_intercept=bool(data["fit_intercept"]),
            components=[
                Component(
                    coef=[float(value) for value in item["coef"]],
                    intercept=float(item["intercept"]),
                    share=float(item["share"]),
                )
                for item in data["components"]
            ],
            baseline_holdout_min_loss=_optional_float(baseline.get("holdout_min_loss")),
            baseline_train_min_loss=float(baseline["train_min_loss"]),
            params=dict(data.get("params") or {}),
            seed=_optional_int(data.get("seed")),
            n_train=int(data["n_train"]),
            n_holdout=int(data["n_holdout"]),
            gate=data.get("gate"),
            keyed=KeyedSummary.from_json(data.get("keyed")),
            raw=data,
        )


@dataclass(frozen=True)
class GroupPredictions:
    """Predictions of rows whose groups are known to a model fitted with groups.

    Attributes
    ----------
    predictions : ndarray of shape (n, k)
        One value per row and line.
    group_line : ndarray of shape (n,)
        The line of each row's group; -1 for a group the fit never saw.
    group_posterior : ndarray of shape (n, k)
        The posterior over the lines of each row's group (the one-hot of its line for a fit
        other than ``em``); a row of NaN for a group the fit never saw.
    """

    predictions: NDArray[np.float64]
    group_line: NDArray[np.int64]
    group_posterior: NDArray[np.float64]


@dataclass(frozen=True)
class EstimatesTable:
    """A model's estimates with standard errors: ``rows`` (dicts with ``component``,
    ``parameter``, ``estimate``, ``std_error``, ``z_value``, ``p_value``, ``lower``, ``upper``
    and, after a bootstrap, ``bootstrap_std_error``, ``bootstrap_lower``, ``bootstrap_upper``;
    None where a number does not exist); ``str()`` prints it per line, as R does, after
    ``note``: which fit the estimates are of."""

    rows: list[dict[str, Any]]
    level: float
    note: str = ""

    def __str__(self) -> str:
        def cell(value: Any, spec: str) -> str:
            return "NA" if value is None else format(value, spec)

        lines = [f"intervals at {self.level:.0%}"] + ([self.note] if self.note else [])
        for component in sorted({row["component"] for row in self.rows}):
            lines += [
                "",
                f"$Comp.{component}",
                f"{'':>16} {'Estimate':>12} {'Std. Error':>12} {'z value':>9} {'Pr(>|z|)':>10} "
                f"{'lower':>12} {'upper':>12}",
            ]
            lines += [
                f"{row['parameter'][:16]:>16} {row['estimate']:12.5g} "
                f"{cell(row['std_error'], '12.5g'):>12} {cell(row['z_value'], '9.3f'):>9} "
                f"{cell(row['p_value'], '10.3g'):>10} {cell(row['lower'], '12.5g'):>12} "
                f"{cell(row['upper'], '12.5g'):>12}"
                for row in self.rows
                if row["component"] == component
            ]
        return "\n".join(lines)


@dataclass(frozen=True)
class GatedPredictions:
    """A gated model's predictions: the k values and the gate's view of them.

    Attributes
    ----------
    predictions : ndarray of shape (n, k)
    probabilities : ndarray of shape (n, k)
        The gate's probability of each line, per row.
    expected : ndarray of shape (n,)
        The probability-weighted mean of the k values.
    most_likely : ndarray of shape (n,)
        The value of the most likely line.
    most_likely_component : ndarray of shape (n,)
        Its index.
    """

    predictions: NDArray[np.float64]
    probabilities: NDArray[np.float64]
    expected: NDArray[np.float64]
    most_likely: NDArray[np.float64]
    most_likely_component: NDArray[np.int64]


@dataclass(frozen=True)
class Scores:
    """Predictions of rows with known targets, and how good they are.

    Attributes
    ----------
    predictions : ndarray of shape (n, k)
        One value per row and line.
    y : ndarray of shape (n,)
        The targets the predictions were scored against.
    min_loss : float
        Mean over the rows of the smallest squared error among the k values.
    best_component : ndarray of shape (n,)
        The line closest to each row's target.
    """

    predictions: NDArray[np.float64]
    y: NDArray[np.float64]
    min_loss: float
    best_component: NDArray[np.int64]

    @property
    def row_min_loss(self) -> NDArray[np.float64]:
        """Shape ``(n,)``: each row's smallest squared error."""
        index = self.best_component[:, np.newaxis]
        best = np.take_along_axis(self.predictions, index, axis=1)[:, 0]
        errors: NDArray[np.float64] = (self.y - best) ** 2
        return errors


@dataclass(frozen=True)
class ModelVersion:
    """One version of a registered model: the model it is and the aliases that point at it."""

    registered_model: str
    version: int
    model_id: str
    aliases: list[str]
    created_at: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def reference(self) -> str:
        """``name/versions/N``, accepted wherever a model id is."""
        return f"{self.registered_model}/versions/{self.version}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelVersion:
        """Read the server's JSON."""
        return cls(
            registered_model=data["registered_model"],
            version=int(data["version"]),
            model_id=data["model_id"],
            aliases=list(data.get("aliases") or []),
            created_at=data["created_at"],
            raw=data,
        )


@dataclass(frozen=True)
class RegisteredModel:
    """A registered model: its latest version and where its aliases point."""

    name: str
    latest_version: int
    aliases: dict[str, int]
    created_at: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RegisteredModel:
        """Read the server's JSON."""
        return cls(
            name=data["name"],
            latest_version=int(data["latest_version"]),
            aliases={str(alias): int(version) for alias, version in data["aliases"].items()},
            created_at=data["created_at"],
            raw=data,
        )


@dataclass(frozen=True)
class Alias:
    """An alias of a registered model and the version it points at."""

    registered_model: str
    alias: str
    version: int
    model_id: str
    previous_version: int | None
    updated_at: str
    updated_by: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def reference(self) -> str:
        """``name@alias``, accepted wherever a model id is."""
        return f"{self.registered_model}@{self.alias}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Alias:
        """Read the server's JSON."""
        return cls(
            registered_model=data["registered_model"],
            alias=data["alias"],
            version=int(data["version"]),
            model_id=data["model_id"],
            previous_version=_optional_int(data.get("previous_version")),
            updated_at=data["updated_at"],
            updated_by=data.get("updated_by"),
            raw=data,
        )
