"""What a fit is, with no database or process code: its spec (:class:`FitSpec`, a job's
columns), the split of a dataset into training and holdout rows (:class:`TrainHoldout`), and
how a model is judged against the one-line least-squares baseline.

The holdout split is derived from the job's seed alone, so a model can be reproduced from its
record; fitting and the baseline share it. The request path reads the spec from here without
importing the worker's fitting code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from mixreg import (
    MixtureOfLinearRegressions,
)

if TYPE_CHECKING:
    from models_store.tables import Job

FloatArray = NDArray[np.float64]
IndexArray = NDArray[np.intp]
ProgressCallback = Callable[[float, dict[str, Any]], None]


def holdout_size(n_rows: int, holdout_fraction: float) -> int:
    """Rows held out: ``holdout_fraction * n_rows`` rounded to the nearest integer."""
    return round(holdout_fraction * n_rows)


def holdout_split(
    n_rows: int, holdout_fraction: float, seed: int, groups: NDArray[Any] | None = None
) -> tuple[IndexArray, IndexArray]:
    """Training and holdout row indices, each in increasing order.

    The holdout is the first ``holdout_size`` entries of
    ``numpy.random.default_rng(seed).permutation(n_rows)``; every other row trains.

    With ``groups`` (a label per row) a group is all training or all holdout: the groups are
    taken in the order of ``default_rng(seed).permutation(n_groups)`` while their rows do not
    pass ``holdout_size`` (the first group at least, when the holdout is not empty); one group
    at least always trains.
    """
    n_holdout = holdout_size(n_rows, holdout_fraction)
    if groups is None:
        permutation = np.random.default_rng(seed).permutation(n_rows)
        return np.sort(permutation[n_holdout:]), np.sort(permutation[:n_holdout])
    _, codes = np.unique(groups, return_inverse=True)
    codes = codes.ravel()
    n_groups = int(codes.max()) + 1 if codes.size else 0
    order = np.random.default_rng(seed).permutation(n_groups)
    taken = np.cumsum(np.bincount(codes, minlength=n_groups)[order]) <= n_holdout
    if n_holdout > 0 and n_groups > 1:
        taken[0] = True
    taken[-1] = False
    held = np.zeros(n_groups, dtype=bool)
    held[order[taken]] = True
    in_holdout = held[codes]
    return np.flatnonzero(~in_holdout), np.flatnonzero(in_holdout)


@dataclass(frozen=True)
class TrainHoldout:
    """A dataset split into its training rows and its holdout rows, each in row order, with
    the rows' weights and group labels when the fit uses them."""

    X_train: FloatArray
    y_train: FloatArray
    X_holdout: FloatArray
    y_holdout: FloatArray
    weights_train: FloatArray | None = None
    weights_holdout: FloatArray | None = None
    groups_train: NDArray[Any] | None = None
    groups_holdout: NDArray[Any] | None = None
    Z_train: FloatArray | None = None
    """The gate's concomitant columns of the training rows, when it reads extra columns."""
    Z_holdout: FloatArray | None = None

    def with_concomitant(self, Z: FloatArray, spec: FitSpec) -> TrainHoldout:
        """The same split with the concomitant columns ``Z`` (all rows, in row order) split
        alike."""
        train, holdout = holdout_split(Z.shape[0], spec.holdout_fraction, spec.seed)
        return replace(self, Z_train=Z[train], Z_holdout=Z[holdout])

    @property
    def n_features(self) -> int:
        """Columns of X."""
        return int(self.X_train.shape[1])

    @classmethod
    def of_arrays(
        cls,
        X: FloatArray,
        y: FloatArray,
        spec: FitSpec,
        *,
        weights: FloatArray | None = None,
        groups: NDArray[Any] | None = None,
    ) -> TrainHoldout:
        """Split ``X`` and ``y`` (and the rows' weights and groups) as ``spec`` says
        (``holdout_split``, groups kept whole)."""
        train, holdout = holdout_split(X.shape[0], spec.holdout_fraction, spec.seed, groups)
        return cls(X[train], y[train], X[holdout], y[holdout]).with_columns(
            train, holdout, weights=weights, groups=groups
        )

    def with_columns(
        self,
        train: IndexArray,
        holdout: IndexArray,
        *,
        weights: FloatArray | None,
        groups: NDArray[Any] | None,
    ) -> TrainHoldout:
        """This split with the weights and group labels of its rows."""
        return replace(
            self,
            weights_train=None if weights is None else weights[train],
            weights_holdout=None if weights is None else weights[holdout],
            groups_train=None if groups is None else groups[train],
            groups_holdout=None if groups is None else groups[holdout],
        )

    @classmethod
    def of_blocks(
        cls,
        blocks: Iterable[tuple[FloatArray, FloatArray]],
        *,
        n_rows: int,
        n_features: int,
        spec: FitSpec,
        weights: FloatArray | None = None,
        groups: NDArray[Any] | None = None,
    ) -> TrainHoldout:
        """Split a dataset read as consecutive blocks of rows, copying each block's rows
        straight to their side: the whole matrix is never held besides its split."""
        train_rows, holdout = holdout_split(n_rows, spec.holdout_fraction, spec.seed, groups)
        in_holdout = np.zeros(n_rows, dtype=bool)
        in_holdout[holdout] = True
        n_holdout = len(holdout)
        split = cls(
            X_train=np.empty((n_rows - n_holdout, n_features), dtype=np.float64),
            y_train=np.empty(n_rows - n_holdout, dtype=np.float64),
            X_holdout=np.empty((n_holdout, n_features), dtype=np.float64),
            y_holdout=np.empty(n_holdout, dtype=np.float64),
        )
        start = train_at = holdout_at = 0
        for X_block, y_block in blocks:
            held = in_holdout[start : start + len(y_block)]
            kept = ~held
            n_held, n_kept = int(held.sum()), len(y_block) - int(held.sum())
            split.X_train[train_at : train_at + n_kept] = X_block[kept]
            split.y_train[train_at : train_at + n_kept] = y_block[kept]
            split.X_holdout[holdout_at : holdout_at + n_held] = X_block[held]
            split.y_holdout[holdout_at : holdout_at + n_held] = y_block[held]
            start, train_at, holdout_at = (
                start + len(y_block),
                train_at + n_kept,
                holdout_at + n_held,
            )
        if start != n_rows:
            raise ValueError(f"the dataset has {n_rows} rows but {start} were read")
        return split.with_columns(train_rows, holdout, weights=weights, groups=groups)


def gating_of(gating: str | Sequence[str] | None) -> str | tuple[str, ...] | None:
    """A fit's gating as a spec holds it: None, ``"features"`` or a tuple of column names."""
    return gating if gating is None or isinstance(gating, str) else tuple(gating)


@dataclass(frozen=True)
class FitSpec:
    """Everything a fit needs besides the data; mirrors a job's columns.

    ``k_values`` makes it a k sweep (one fit per k); ``n_components`` is then the largest k.
    """

    algorithm: str
    n_components: int
    params: Mapping[str, Any]
    fit_intercept: bool
    holdout_fraction: float
    seed: int
    time_budget_s: float | None
    k_values: tuple[int, ...] | None = None
    weights_column: str | None = None
    """The dataset column of the rows' weights."""
    groups_column: str | None = None
    """The dataset column of the rows' group labels."""
    standard_errors: bool | None = False
    """Whether the fit computes standard errors; None: when the training rows number at most
    ``AUTO_STANDARD_ERRORS_MAX_ROWS``."""
    n_bootstrap: int = 0
    bootstrap: str = "parametric"

    @property
    def uncertainty(self) -> dict[str, Any]:
        """The standard errors and bootstrap asked for, as a job stores them."""
        return {
            "standard_errors": self.standard_errors,
            "n_bootstrap": self.n_bootstrap,
            "bootstrap": self.bootstrap,
        }

    gating: str | tuple[str, ...] | None = None
    """None (no gate), ``"features"``, or the dataset's extra columns the gate reads."""

    @property
    def all_n_components(self) -> tuple[int, ...]:
        """Every k to fit, in increasing order."""
        return self.k_values or (self.n_components,)

    @classmethod
    def of_job(cls, job: Job) -> FitSpec:
        """The spec stored on ``job`` (jobs stored before revision 0011 computed no standard
        errors)."""
        uncertainty = job.uncertainty or {}
        return cls(
            algorithm=job.algorithm,
            n_components=job.n_components,
            params=dict(job.params),
            fit_intercept=job.fit_intercept,
            holdout_fraction=job.holdout_fraction,
            seed=job.seed if job.seed is not None else 0,
            time_budget_s=job.time_budget_s,
            k_values=None if job.k_values is None else tuple(job.k_values),
            weights_column=job.weights_column,
            groups_column=job.groups_column,
            standard_errors=uncertainty.get("standard_errors", False),
            n_bootstrap=int(uncertainty.get("n_bootstrap", 0)),
            bootstrap=str(uncertainty.get("bootstrap", "parametric")),
            gating=gating_of(job.gating),
        )

    @property
    def concomitant_names(self) -> list[str] | None:
        """The extra columns the gate reads (None without a gate or when it reads the
        features)."""
        return None if self.gating is None or isinstance(self.gating, str) else list(self.gating)

    def estimator(self, n_components: int | None = None) -> MixtureOfLinearRegressions:
        """The unfitted estimator this spec describes (for ``n_components`` lines if given)."""
        return MixtureOfLinearRegressions(
            n_components=self.n_components if n_components is None else n_components,
            algorithm=self.algorithm,
            fit_intercept=self.fit_intercept,
            random_state=self.seed,
            time_budget=self.time_budget_s,
            # The bootstrap refits from the maximum-likelihood fit the standard errors find.
            standard_errors=bool(self.standard_errors) or self.n_bootstrap > 0,
            gating=self.gating is not None,
            **self.params,
        )


# Min-losses this close (relative) tie: a single line fitted two ways (k = 1) neither beats the
# least-squares baseline nor trails it.
BASELINE_TIE_RTOL = 1e-9


def baseline_comparison(
    *, train_min_loss: float, holdout_min_loss: float | None, baseline: Mapping[str, Any]
) -> tuple[str, float, float]:
    """The rows a model is judged on against the baseline, its min-loss and the baseline's:
    the holdout rows, or the training rows when nothing is held out."""
    baseline_holdout = baseline.get("holdout_min_loss")
    if holdout_min_loss is not None and baseline_holdout is not None:
        return "holdout", holdout_min_loss, float(baseline_holdout)
    return "training", train_min_loss, float(baseline["train_min_loss"])


def beats_baseline(
    *, train_min_loss: float, holdout_min_loss: float | None, baseline: Mapping[str, Any]
) -> bool:
    """True if the model's holdout min-loss (training min-loss without a holdout) is below the
    one-line least-squares baseline's by more than a rounding difference."""
    _, loss, reference = baseline_comparison(
        train_min_loss=train_min_loss, holdout_min_loss=holdout_min_loss, baseline=baseline
    )
    return loss < reference - BASELINE_TIE_RTOL * abs(reference)
