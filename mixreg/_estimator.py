"""The estimator: its parameters, ``fit`` in named steps, predictions, min-loss and document.

``fit`` orchestrates; the work is elsewhere: the checked rows (:mod:`._fit_data`), the scaled
units (:mod:`._scaling`), the algorithms (:mod:`._solvers`, :mod:`._auto`), the gate
(:mod:`._gate_fit`), standard errors (:mod:`._standard_errors`), warnings
(:mod:`._fit_warnings`); each optional sub-result is a record of :mod:`._fitted`. The methods
of a gated model and the inference methods are the bases :class:`GatedPredictions` and
:class:`InferenceMethods`.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from ._am import SolverResult, assign_many, refit_exactly_until_stable
from ._auto import AutoResult, default_n_init, fit_auto
from ._document_methods import DocumentMethods
from ._em import EMResult
from ._fit_data import FitData, check_fit_data
from ._fit_warnings import (
    warn_if_degenerate,
    warn_if_unconverged,
)
from ._fitted import em_mixture, grouped_fit, grouped_maximum_likelihood, remove_optional_results
from ._gate_fit import GatedFit, finish_gate, fit_gate, gate_result
from ._gated_predictions import GatedPredictions
from ._grouped_mixture import grouped_mixture
from ._inference_methods import InferenceMethods
from ._loss import (
    Grouping,
    predict_lines,
    row_min_losses,
    single_threaded_blas,
    weighted_mean,
    weighted_min_loss,
)
from ._scaling import Scaling, in_caller_units
from ._solvers import SOLVERS, FitContext
from ._standard_errors import (
    gate_standard_errors,
    mixture_standard_errors,
)
from ._streamed import fit_streamed, streamed_source
from ._subsample import exhaustive_subsample_size
from ._validation import (
    PARAMETER_NAMES,
    as_generator,
    check_algorithm,
    check_groups,
    check_sample_weight,
    check_X,
    check_X_y,
    resolve_parameters,
)

FloatArray = NDArray[np.float64]
ProgressCallback = Callable[[float, dict[str, Any]], None]

_SOLVERS: dict[str, Callable[[FitContext], SolverResult]] = {**SOLVERS, "auto": fit_auto}


def component_order(
    coef: FloatArray, intercept: FloatArray, shares: FloatArray, x_mean: FloatArray
) -> NDArray[np.intp]:
    """The documented order of fitted lines: largest share first; equal shares by the line's
    value at the training rows' mean features (largest first, so the order does not depend
    on where the features' origin is), then by coefficients.

    The order depends only on the set of lines, never on the order they come in.
    """
    centre_value = intercept + coef @ x_mean
    order: NDArray[np.intp] = np.lexsort((*coef.T[::-1], -centre_value, -shares))
    return order


def _ends_in_least_squares(algorithm: str) -> bool:
    """Whether the algorithm ends at a fixed point of classical AM: each line the least-squares
    line of the rows it wins (the other algorithms keep their own, documented last step)."""
    return algorithm == "auto"


def _scaled_loss(ctx: FitContext, theta: FloatArray) -> float:
    """The (weighted, grouped) min-loss of lines in the scaled units of the fit."""
    squared, _ = assign_many(
        ctx.Z, ctx.y, theta[None], sample_weight=ctx.sample_weight, grouping=ctx.grouping
    )
    return float(weighted_mean(squared[0], ctx.sample_weight))


class MixtureOfLinearRegressions(
    InferenceMethods,
    GatedPredictions,
    DocumentMethods,
    BaseEstimator,  # type: ignore[misc]
):
    """Mixture of k linear regressions with list-decoded predictions.

    Fits k lines ``y ~ <x, coef_j> + intercept_j`` that minimise the min-loss
    ``(1/n) sum_i min_j (y_i - <x_i, coef_j> - intercept_j)^2`` (no generative model assumed) and
    predicts, for each row, the list of the k lines' values.

    Internally every feature and y are centred on their means (with an intercept) and
    scaled, then the data are scaled as in the paper (max row norm of X and max |y| equal 1,
    with a constant column for the intercept), so ``step_size`` keeps the paper's meaning and
    every algorithm is equivariant under shifts and scalings of the features and of y; fitted
    lines are reported in the caller's units. Every least-squares solve is centred per part,
    as ``LinearRegression``'s.

    Parameters
    ----------
    n_components : int, default=2
        The number of lines k.
    algorithm : {"auto", "subsample+am", "am", "am-classic", "subsample", \
"subsample-exhaustive", "em"}, default="auto"
        - ``"auto"`` (default): the best of many, searched until it stops improving.
          Candidate line sets come from ``n_init`` random starts (least-squares lines of random
          partitions and of random small sets of rows), the paper's A3, EM restarts and
          Algorithm 3 with RANSAC, each polished by classical AM (which never increases its
          min-loss). Then rounds of moves from the best: a line that fits its rows badly split
          in two while a slot is freed by dropping or merging lines, a line moved to where the
          others fit worst (rows drawn by their squared residual, as k-means++ does), and a line
          replaced by a fresh one; the rounds stop after 3 in a row that improved the best
          min-loss by a relative 1e-4 or less. Batches of fresh random starts, each with its own
          rounds, follow while they improve the best (the search stops after 2 that did not).
          Without a ``time_budget`` the rounds and restarts also stop at a cap on their work
          that grows with the rows, features and k searched (about 5 s of one core on small
          data, at most about 40 s); the cap counts multiply-adds, not seconds, so the result
          depends on the seed only. On more than 20,000 rows the search runs on a sample of
          20,000 rows, and the best candidates are polished again on all rows: at least three,
          and every one whose sample min-loss is within two standard errors of the best's
          (at most eight). ``candidates_`` records them all. With one line, least squares on
          all rows is the exact answer and the only candidate. With ``groups`` the search
          starts with grouped EM from ``n_init`` random partitions of the groups (at most 10),
          each polished by grouped classical AM, and stops there when half of them (two at
          least) reach the best min-loss (within a relative 1e-6); otherwise the sources,
          rounds and restarts above follow.
        - ``"am"``: Algorithm 1, gradient AM from Gaussian random lines (or ``init``).
        - ``"am-classic"``: AM with an exact least-squares refit per part, started from the lines
          of a random partition of the rows (``n_init`` starts run as one batch).
        - ``"subsample"``: Algorithm 3, ``n_partitions`` random partitions of a sub-sample of
          ``subsample_size`` rows, a least-squares or RANSAC line per part, the best candidate on
          all rows, refitted on the rows each line wins.
        - ``"subsample-exhaustive"``: Algorithm 2, every partition of the sub-sample.
        - ``"subsample+am"``: the paper's A3, Algorithm 3 then Algorithm 1 from its lines.
        - ``"em"``: EM for a Gaussian mixture of regressions (per-line weight and noise variance),
          started like flexmix from a random partition of the rows.
    fit_intercept : bool, default=True
    random_state : None, int, numpy.random.Generator or RandomState
        The single source of randomness of a fit.
    step_size : float or "auto", default="auto"
        The paper's gamma (``am``, ``subsample+am``). ``"auto"`` moves each line within the
        span of its gradient in whitened coordinates (the features' inverse Gram matrix times
        the gradient) and its previous step, to the point that minimizes its objective on its
        current rows, so the min-loss never increases and Algorithm 1 converges in about the
        paper's T = 50 steps whatever the units of the features; a number keeps the paper's
        exact update
        ``theta_j -= (gamma / n) sum_{i in S_j} grad F_i(theta_j)``.
    max_iter : int, default=100 (200 for ``em``)
        The paper's T (``am``, ``am-classic``, ``subsample+am``, ``em``); for ``auto``, the
        classical AM iterations of each candidate's polish.
    tol : float, default=1e-6
        Stop when the relative change of the min-loss between iterations is at most ``tol``;
        for ``em``, when the mean log-likelihood per row changes by at most ``tol``.
    n_init : int, default=1 (size-aware for ``auto``)
        Random starts (``am``, ``am-classic``, ``em``); the lowest training min-loss is kept
        (for ``em``, the highest log-likelihood).
        For ``auto``, the number of random starts of the first round, from 100 on small data
        down to 4 on large data (``n_init // 4`` EM restarts, at most 10, run beside them);
        each later batch of restarts has ``n_init`` starts too, at most 20. With groups, the
        grouped EM starts come first (at most 10, see ``algorithm``).
    init : array-like of shape (n_components, n_features + fit_intercept), optional
        Starting lines: coefficients then intercept, in the caller's units (``am``,
        ``am-classic``, ``em``); for ``auto``, one more candidate, polished and searched
        around like the others (a warm start from yesterday's lines; a k sweep gives each k
        the (k - 1)-line fit plus one line this way).
    subsample_size : int, default=150
        |A|, drawn uniformly with replacement. For ``subsample-exhaustive`` the default is the
        largest size whose number of partitions (a Stirling number) is at most 100,000.
    n_partitions : int, default=1000
        The paper's h (``subsample``, ``subsample+am``).
    base : {"ls", "ransac"}, default="ls"
        Fit per part and for the final refit: least squares, or RANSAC with
        ``sklearn.linear_model.RANSACRegressor``'s default semantics.
    time_budget : float, optional
        Seconds. The sub-sample search is anytime and returns the best candidate found so far;
        iterative algorithms return their current lines; ``auto`` skips the sources it has
        no time left for, stops its rounds and restarts at the budget instead of at its work
        cap (so a budget above the cap lets the search go on while it still improves), and
        returns the best candidate so far, polished where it is. At least one batch, step or
        source runs. A fit with a time budget depends on the machine's speed and load, not only
        on the seed: how many candidates fit in the budget does.
    standard_errors : bool, default=False
        Also compute standard errors from the observed information of the Gaussian mixture
        of regressions at its maximum-likelihood fit (``coef_se_`` and the other ``*_se_``
        attributes, :meth:`summary`, :meth:`confidence_intervals`): the highest maximum EM
        reaches from the fitted lines and from 10 random partitions of the rows, as flexmix's
        ``stepFlexmix(nrep = 10)`` starts (``ml_start_`` says which won). It costs EM on a
        sample of at most 20,000 rows, an EM polish of one to three starts and one pass of
        products over the rows. For a gated fit, those of the gated mixture (lines, noise
        variances and the gate's free rows, ``gate_coef_se_`` and ``gate_intercept_se_``) at
        the maximum that Newton's method reaches from gated EM's fit; sample weights and
        groups are not taken with a gate.
    gating : bool, default=False
        Whether the mixing probabilities depend on each row (flexmix's ``FLXPmultinom``
        concomitant model): ``pi_j(z) = softmax_j(<z, gate_coef_j> + gate_intercept_j)``, with
        z the features, or the ``concomitant`` columns given to :meth:`fit`. The lines found by
        ``algorithm`` (the lowest min-loss) start EM for the gated Gaussian mixture of
        regressions, whose M-step fits the lines by weighted least squares, their noise
        variances, and the gate's multinomial logit (first component as reference) by a
        warm-started Newton method; EM stops when the mean log-likelihood per row changes by at
        most 1e-8, after 1,000 iterations, or at the time budget. Gated EM also starts from the
        best of 5 (ungated) EM restarts from random partitions of the rows, as flexmix starts,
        and the start that ends with the higher likelihood is kept: the lowest min-loss lines
        need not lie near the likelihood's highest maximum. The fitted lines are then the
        gated mixture's. With sample weights every step of it is weighted (a row of weight w
        counts as w copies of itself, in the gate's Newton steps too). Without a gate nothing
        of the above runs.

    Attributes
    ----------
    coef_ : ndarray of shape (n_components, n_features)
    intercept_ : ndarray of shape (n_components,)
    shares_ : ndarray of shape (n_components,)
        Fraction of training rows each line predicts best (of their total weight, with
        sample weights; with groups, each row counts for its group's line). Components are
        ordered by share, largest first; equal shares by the line's value at the mean of the
        training features, largest first, then by coefficients (:func:`component_order`).
        Every output that lists lines (standard errors, summaries, bootstrap replicates, each
        k of a sweep) uses this order.
    loss_history_ : ndarray
        Training min-loss per iteration (AM, EM) or best candidate per batch of partitions
        followed by the loss after the refit (sub-sample algorithms); for ``subsample+am`` the
        search's history followed by AM's.
    n_iter_ : int
        Iterations run (AM, EM; for ``auto``, the classical AM iterations of the chosen
        candidate's polish), or candidate line sets tried (``subsample``,
        ``subsample-exhaustive``).
    n_candidates_ : int
        Candidate line sets tried (sub-sample algorithms; 0 otherwise).
    converged_ : bool
        Whether the fit stopped by its own rule: ``tol`` or a fixed point (iterative
        algorithms and the polish of ``auto``), every partition tried (sub-sample
        algorithms). False when ``max_iter`` or the time budget stopped it.
    train_loss_ : float
        Training min-loss of the fitted lines (weighted, and grouped, as the fit was).
    weights_, noise_variance_ : ndarray of shape (n_components,)
        For ``em``, a gated fit, a grouped ``auto`` fit and every algorithm with
        ``standard_errors=True``: the mixture weights (for a gated fit, the mean gate
        probability of each line over the training rows) and per-line noise variances
        (caller's units); with ``standard_errors`` or ``auto``, those of the
        maximum-likelihood fit below.
    ml_coef_, ml_intercept_ : ndarray of shape (n_components, n_features), (n_components,)
        Only with ``standard_errors=True``, or after an ``auto`` fit with groups: the
        maximum-likelihood fit of the Gaussian mixture of regressions, the estimates the
        standard errors belong to (not the served min-loss lines): with
        ``standard_errors=True`` the highest maximum EM reaches from the fitted lines and from
        random partitions of the rows (:mod:`mixreg._likelihood`), each line matched to its
        min-loss line's index. With groups it is grouped EM's (each group's rows from one
        line), run to EM's tolerance (1e-6), or the search's best EM start when that ends
        higher (its lines matched to the fitted ones), so its likelihood is at least that of
        ``em`` with the same seed and ``n_init`` (at most 10). For ``em`` they are ``coef_`` and
        ``intercept_`` run to a tighter tolerance; for the min-loss algorithms they are close
        to the fitted lines when the lines are well separated (see ADR 0021).
    ml_start_ : {"min-loss lines", "em restart"}
        Only with ``standard_errors=True`` (no gate): where EM started that reached
        ``ml_coef_``: the fitted lines, or a random partition of the rows.
    coef_se_, intercept_se_, weights_se_, noise_variance_se_ : ndarray
        Only with ``standard_errors=True``: standard errors of ``ml_coef_``,
        ``ml_intercept_``, ``weights_`` and ``noise_variance_`` from the observed information
        (as ``flexmix::refit``); NaN when the information is singular (a warning says so).
    covariance_ : ndarray of shape (k * (n_features + fit_intercept + 1) + k,) * 2
        Only with ``standard_errors=True``: their joint covariance, per line its coefficients,
        intercept and noise variance, then the k weights; for a gated fit, after the lines the
        gate's free rows (components 1..k-1), each its slopes then its intercept, in place of
        the weights (of shape ``k * (n_features + fit_intercept + 1) + (k - 1) *
        (n_concomitant + 1)``).
    gate_coef_se_, gate_intercept_se_ : ndarray
        Of shapes (n_components, n_concomitant) and (n_components,). Only for a gated fit
        with ``standard_errors=True``: standard errors of ``gate_coef_`` and
        ``gate_intercept_`` (zero for the reference, the first component, fixed at zero);
        ``weights_se_`` is then NaN (the weights are the gate's mean probabilities).
    gate_coef_ : ndarray of shape (n_components, n_concomitant)
        Only for a gated fit: the gate's slopes on the raw concomitant columns (the features
        when no ``concomitant`` was given); the first row, the reference, is zero.
    gate_intercept_ : ndarray of shape (n_components,)
        Only for a gated fit; the first is zero.
    log_likelihood_ : float
        Only for a gated fit, with ``standard_errors=True``, or after an ``auto`` fit with
        groups: the gated mixture's total log-likelihood of the training rows (weighted by
        ``sample_weight``), or the maximum-likelihood fit's (with groups, the sum over the
        groups of the log of each group's mixture density).
    bic_ : float
        Only for a gated fit: ``-2 log_likelihood_ + n_parameters log(n_samples)`` with
        ``n_parameters`` counting every line's coefficients and intercept, its noise variance
        and the ``(n_components - 1) * (n_concomitant + 1)`` free parameters of the gate;
        with sample weights ``n_samples`` is their total.
    log_likelihood_history_ : ndarray
        Only for a gated fit: gated EM's mean log-likelihood per row (per unit of weight) at
        every iteration.
    gate_n_iter_ : int
    gate_converged_ : bool
        Only for a gated fit: gated EM's iterations, and whether it stopped by its tolerance
        (not by its iteration cap or the time budget).
    gate_start_ : {"lines", "em restart"}
        Only for a gated fit: where the kept gated EM started (see ``gating``).
    gate_on_features_ : bool
        Only for a gated fit: whether the gate reads the features (no ``concomitant``).
    n_concomitant_in_ : int
        Only for a gated fit: the gate's number of columns.
    n_features_in_ : int
    group_labels_ : ndarray of shape (n_groups,)
        Only after a fit with ``groups``: the distinct training groups, sorted (groups whose
        rows all weigh zero are left out).
    group_line_ : ndarray of shape (n_groups,)
        Only after a fit with ``groups``: the line of each of ``group_labels_``.
    group_posterior_ : ndarray of shape (n_groups, n_components)
        Only after an ``em`` fit with ``groups``: each group's posterior over the lines.
    candidates_ : list of dict
        Only for ``auto``: every candidate tried, in order, with its ``source``, its training
        min-loss before and after polishing (``min_loss_before``, ``min_loss_after``, caller's
        units, on the ``n_rows`` it was polished on), ``seconds``, ``n_iter`` and
        ``converged``.

    Warns
    -----
    ConvergenceWarning
        When an iterative algorithm (or the polish of ``auto``'s chosen candidate) stops at
        ``max_iter`` before converging, with what to change; not when ``tol=0``, which asks
        for exactly ``max_iter`` iterations, nor when the time budget stopped it.

    Notes
    -----
    A line that wins no training rows is never refitted on an empty set: AM leaves it where
    it is (its gradient is zero), classical AM and the sub-sample refit keep its previous
    value, EM floors its weight and variance. It keeps a share of 0 and finite coefficients.
    """

    def __init__(
        self,
        n_components: int = 2,
        algorithm: str = "auto",
        fit_intercept: bool = True,
        random_state: Any = None,
        step_size: float | str | None = None,
        max_iter: int | None = None,
        tol: float | None = None,
        n_init: int | None = None,
        init: ArrayLike | None = None,
        subsample_size: int | None = None,
        n_partitions: int | None = None,
        base: str | None = None,
        time_budget: float | None = None,
        standard_errors: bool = False,
        gating: bool = False,
    ) -> None:
        self.n_components = n_components
        self.algorithm = algorithm
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.step_size = step_size
        self.max_iter = max_iter
        self.tol = tol
        self.n_init = n_init
        self.init = init
        self.subsample_size = subsample_size
        self.n_partitions = n_partitions
        self.base = base
        self.time_budget = time_budget
        self.standard_errors = standard_errors
        self.gating = gating

    def resolved_parameters(self, n_samples: int, n_features: int) -> dict[str, Any]:
        """Check the estimator's settings for data of this size; return the algorithm's params.

        Raises ValueError naming what is wrong. The service calls this before queueing a fit.
        """
        algorithm = check_algorithm(self.algorithm)
        if (
            isinstance(self.n_components, bool)
            or not isinstance(self.n_components, numbers.Integral)
            or self.n_components < 1
        ):
            raise ValueError(f"n_components must be an integer >= 1; got {self.n_components!r}")
        if self.n_components > n_samples:
            raise ValueError(
                f"n_components={self.n_components} exceeds the {n_samples} training rows"
            )
        if not isinstance(self.fit_intercept, bool | np.bool_):
            raise ValueError(f"fit_intercept must be True or False; got {self.fit_intercept!r}")
        if not isinstance(self.standard_errors, bool | np.bool_):
            raise ValueError(f"standard_errors must be True or False; got {self.standard_errors!r}")
        if not isinstance(self.gating, bool | np.bool_):
            raise ValueError(f"gating must be True or False; got {self.gating!r}")
        given = {name: getattr(self, name) for name in PARAMETER_NAMES}
        params = resolve_parameters(
            algorithm,
            given,
            n_components=int(self.n_components),
            n_samples=n_samples,
            n_params=n_features + bool(self.fit_intercept),
        )
        if algorithm == "auto" and params["n_init"] is None:
            params["n_init"] = default_n_init(
                n_samples, n_features + bool(self.fit_intercept), int(self.n_components)
            )
        if algorithm == "subsample-exhaustive":
            params["subsample_size"] = exhaustive_subsample_size(
                int(self.n_components), params["subsample_size"]
            )
        return params

    def fit(
        self,
        X: ArrayLike,
        y: ArrayLike | None = None,
        sample_weight: ArrayLike | None = None,
        groups: ArrayLike | None = None,
        *,
        progress: ProgressCallback | None = None,
        concomitant: ArrayLike | None = None,
    ) -> MixtureOfLinearRegressions:
        """Fit the k lines (and, with ``gating``, the gate).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), ChunkSource or dask collection
            Rows in memory, or rows read in chunks by every pass of a streamed fit
            (:mod:`mixreg._streamed`: a :class:`~mixreg.ArrayChunks`,
            :class:`~mixreg.NpyChunks` holding y and the weights, or a dask array or DataFrame
            with dask ``y`` and ``sample_weight``; ``algorithm="auto"`` without groups, gate
            or standard errors).
        y : array-like of shape (n_samples,)
            Required unless ``X`` is a ChunkSource.
        sample_weight : array-like of shape (n_samples,), optional
            Non-negative row weights, read as replication weights (as flexmix's): every
            algorithm minimizes or maximizes the weighted objective (weighted min-loss
            ``(1/W) sum_i w_i min_j r_ij^2`` with ``W = sum_i w_i``, weighted likelihood for
            EM), its scaling statistics and least-squares fits are weighted, and the
            sub-sample and random-row draws pick a row with probability proportional to its
            weight. From the same start, an integer weight gives the lines that many copies of
            the row give, and a zero weight the lines without the row (zero-weight rows are
            dropped first). Where a random algorithm draws rows (``subsample``,
            ``subsample+am``, the sources of ``auto``, RANSAC's minimal subsets) a weighted fit
            is not the same random draw as one on repeated rows, so the two agree only from the
            same drawn start. Equal weights fit as no weights.
        groups : array-like of shape (n_samples,), optional
            A hashable label per row; every row of a group is assigned to the same line. The
            min-loss becomes ``(1/W) sum_g min_j sum_{i in g} w_i r_ij^2``; ``am-classic``
            assigns whole groups, ``em`` gives each group a posterior (the product of its rows'
            likelihoods) and ``auto`` starts from grouped EM fits, polishes every candidate by
            grouped classical AM and moves whole groups (it also reports the
            maximum-likelihood mixture: ``ml_coef_``, ``weights_``, ``noise_variance_``,
            ``log_likelihood_``). Other algorithms raise ValueError. With one row per group
            the lines are the ungrouped fit's.
        progress : callable, optional
            ``progress(fraction, info)`` is called as the fit advances, with ``info`` holding
            ``iteration``, ``candidates_tried`` and ``best_loss`` (training min-loss so far, in
            the caller's units; ``None`` where not applicable). An exception raised by it stops
            the fit and propagates.
        concomitant : array-like of shape (n_samples, n_concomitant), optional
            The columns the gate reads instead of the features (``gating=True`` only).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Naming ``sample_weight`` (negative, NaN or infinite weights, wrong length, every
            weight zero) or ``groups`` (wrong length, a missing label, an algorithm that does
            not fit groups), or the parameter that is wrong.
        """
        source = streamed_source(X, y, sample_weight, groups, concomitant)
        if source is not None:
            # Rows read in chunks (a ChunkSource, dask arrays): every pass streams them.
            return fit_streamed(self, source, progress=progress)
        if y is None:
            raise ValueError("y: the targets are required (only a ChunkSource X holds them)")
        started = time.monotonic()
        data = check_fit_data(
            X,
            y,
            sample_weight,
            groups,
            concomitant,
            algorithm=self.algorithm,
            standard_errors=bool(self.standard_errors),
            gating=bool(self.gating),
        )
        params = self.resolved_parameters(*data.X.shape)
        if self.gating and data.grouping is not None:
            raise ValueError("groups: a gated fit takes no groups")
        if self.gating and data.weights is not None and self.standard_errors:
            raise ValueError(
                "standard_errors: a gated fit with sample weights has no standard errors; "
                "leave out one of them"
            )
        remove_optional_results(self)
        scaling, ctx = self._fit_context(data, params, started, progress)
        with single_threaded_blas():
            result, mixture, gate = self._solve(ctx, data)
        row_lines, order = self._set_lines(data, ctx, scaling, result)
        if isinstance(result, EMResult):
            em_mixture(result, order, ctx.loss_scale).set_on(self)
        if mixture is not None:
            observations = data.y.size if data.weights is None else data.weights
            grouped_maximum_likelihood(mixture, order, scaling, observations).set_on(self)
        if isinstance(result, AutoResult):
            self.candidates_ = [
                candidate.to_dict(ctx.loss_scale) for candidate in result.candidates
            ]
        if data.grouping is not None and data.group_labels is not None:
            grouped_fit(ctx, result, data.group_labels, row_lines, order).set_on(self)
        if gate is not None:
            on_features = data.gate_columns is None
            gate_result(gate, order, ctx, scaling, on_features=on_features).set_on(self)
        warn_if_unconverged(self.algorithm, result, params, ctx.deadline)
        rows_per_line = np.bincount(row_lines, minlength=ctx.n_components)
        warn_if_degenerate(rows_per_line[order].astype(np.float64), ctx.Z.shape[1])
        if self.standard_errors:
            with single_threaded_blas():
                self._set_standard_errors(ctx, scaling, result.theta[order], gate, order)
        ctx.report(
            1.0,
            iteration=result.n_iter,
            candidates=result.n_candidates or None,
            # In scaled units: train_loss_ / loss_scale is 0 / 0 when y_scale**2 underflows.
            loss=_scaled_loss(ctx, result.theta),
        )
        return self

    def _fit_context(
        self,
        data: FitData,
        params: dict[str, Any],
        started: float,
        progress: ProgressCallback | None,
    ) -> tuple[Scaling, FitContext]:
        """The fit's scaling and what every algorithm reads: the rows in scaled units, the
        resolved parameters (``init`` scaled), the random generator and the deadline."""
        scaling, Z, y_scaled = Scaling.of(data.X, data.y, bool(self.fit_intercept), data.weights)
        if params.get("init") is not None:
            params["init"] = scaling.to_scaled(params["init"])
        budget = params.get("time_budget")
        ctx = FitContext(
            Z=Z,
            y=y_scaled,
            n_components=int(self.n_components),
            n_features=data.X.shape[1],
            params=params,
            rng=as_generator(self.random_state),
            deadline=None if budget is None else started + budget,
            started=started,
            loss_scale=scaling.y_scale**2,
            progress=progress,
            sample_weight=data.weights,
            grouping=data.grouping,
        )
        return scaling, ctx

    def _solve(
        self, ctx: FitContext, data: FitData
    ) -> tuple[SolverResult, EMResult | None, GatedFit | None]:
        """The algorithm's lines (scaled), then the least-squares refit ``auto`` ends in, the
        maximum-likelihood mixture of a grouped ``auto`` fit and, with ``gating``, the gate
        (whose lines become the fit's)."""
        result = _SOLVERS[self.algorithm](ctx)
        if _ends_in_least_squares(self.algorithm):
            before = result.loss
            result.theta = refit_exactly_until_stable(
                ctx.Z,
                ctx.y,
                result.theta,
                deadline=ctx.deadline,
                sample_weight=ctx.sample_weight,
                grouping=ctx.grouping,
            )
            after = _scaled_loss(ctx, result.theta)
            if after < before * (1.0 - 1e-9):
                result.loss_history = [*result.loss_history, after]
        mixture = None
        if isinstance(result, AutoResult) and ctx.grouping is not None:
            mixture = grouped_mixture(ctx, result.theta, result.em_restart)
        gate = None
        if self.gating:
            columns = data.X if data.gate_columns is None else data.gate_columns
            gate = fit_gate(ctx, columns, result.theta)
            if self.standard_errors:
                finish_gate(ctx, gate)
            result.theta = gate.em.theta
        return result, mixture, gate

    def _set_lines(
        self, data: FitData, ctx: FitContext, scaling: Scaling, result: SolverResult
    ) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        """The fitted lines and their shares in the documented order, with the trace of the
        fit; returns each row's line (before ordering) and the order."""
        coef, intercept = scaling.to_caller(result.theta)
        _, labels = assign_many(
            ctx.Z, ctx.y, result.theta[None], sample_weight=data.weights, grouping=data.grouping
        )
        row_weight = np.ones(data.y.size) if data.weights is None else data.weights
        shares = np.bincount(labels[0], weights=row_weight, minlength=ctx.n_components).astype(
            np.float64
        ) / float(row_weight.sum())
        order = component_order(coef, intercept, shares, weighted_mean(data.X.T, data.weights))
        self.coef_ = coef[order]
        self.intercept_ = intercept[order]
        self.shares_ = shares[order]
        self.loss_history_ = in_caller_units(result.loss_history, ctx.loss_scale)
        self.train_loss_ = weighted_min_loss(
            data.y,
            predict_lines(data.X, self.coef_, self.intercept_),
            data.weights,
            data.grouping,
        )
        self.n_iter_ = result.n_iter
        self.n_candidates_ = result.n_candidates
        self.converged_ = result.converged
        self.n_features_in_ = data.X.shape[1]
        return labels[0], order

    def _set_standard_errors(
        self,
        ctx: FitContext,
        scaling: Scaling,
        theta: FloatArray,
        gate: GatedFit | None,
        order: NDArray[np.intp],
    ) -> None:
        """The maximum-likelihood fit the standard errors belong to and the errors, from the
        scaled lines ``theta`` in the output order (or the gate's fit)."""
        if gate is None:
            mixture, errors = mixture_standard_errors(
                ctx, theta, scaling, self.n_features_in_, bool(self.fit_intercept)
            )
        else:
            mixture, errors = gate_standard_errors(
                gate,
                order,
                ctx,
                scaling,
                coef=self.coef_,
                intercept=self.intercept_,
                fit_intercept=bool(self.fit_intercept),
            )
        mixture.set_on(self)
        errors.set_on(self)

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise NotFittedError(
                "This MixtureOfLinearRegressions is not fitted yet; call fit(X, y) first."
            )

    def predict(self, X: ArrayLike) -> FloatArray:
        """List-decoded predictions: one column per line.

        Returns
        -------
        predictions : ndarray of shape (n_samples, n_components)
        """
        self._check_fitted()
        X_arr = check_X(X, n_features=self.n_features_in_)
        return predict_lines(X_arr, self.coef_, self.intercept_)

    def min_loss(
        self,
        X: ArrayLike,
        y: ArrayLike,
        sample_weight: ArrayLike | None = None,
        groups: ArrayLike | None = None,
    ) -> float:
        """The paper's min-loss of the fitted lines on (X, y).

        With ``sample_weight``, ``(1/W) sum_i w_i min_j r_ij^2``; with ``groups``, each
        group takes its own best line: ``(1/W) sum_g min_j sum_{i in g} w_i r_ij^2``.
        """
        self._check_fitted()
        X_arr, y_arr = check_X_y(X, y)
        predictions = predict_lines(
            check_X(X_arr, n_features=self.n_features_in_), self.coef_, self.intercept_
        )
        if sample_weight is None and groups is None:
            return float(row_min_losses(y_arr, predictions).mean())
        weights = None if sample_weight is None else check_sample_weight(sample_weight, len(y_arr))
        grouping = None if groups is None else Grouping.of(check_groups(groups, len(y_arr))[1])
        return weighted_min_loss(y_arr, predictions, weights, grouping)

    def predict_group(self, groups: ArrayLike) -> NDArray[np.intp]:
        """The line of each training group, -1 for a group not seen in training.

        Parameters
        ----------
        groups : array-like of shape (n_samples,)
            Group labels, of the type given to :meth:`fit`.

        Returns
        -------
        lines : ndarray of shape (n_samples,)
        """
        self._check_fitted()
        if not hasattr(self, "group_line_"):
            raise NotFittedError("This MixtureOfLinearRegressions was not fitted with groups.")
        labels = np.asarray(groups)
        if labels.ndim != 1:
            raise ValueError(f"groups must be 1-dimensional; got shape {labels.shape}")
        try:
            at = np.searchsorted(self.group_labels_, labels)
        except TypeError as exc:
            raise ValueError(
                f"groups must be labels of the type the model was fitted with: {exc}"
            ) from None
        inside = at < self.group_labels_.size
        known = np.zeros(labels.shape[0], dtype=bool)
        known[inside] = self.group_labels_[at[inside]] == labels[inside]
        lines: NDArray[np.intp] = np.where(
            known, self.group_line_[np.where(known, at, 0)], -1
        ).astype(np.intp)
        return lines

    def best_component(self, X: ArrayLike, y: ArrayLike) -> NDArray[np.intp]:
        """Index of the line that predicts each row best (ties to the lowest index)."""
        self._check_fitted()
        X_arr, y_arr = check_X_y(X, y)
        predictions = predict_lines(
            check_X(X_arr, n_features=self.n_features_in_), self.coef_, self.intercept_
        )
        best: NDArray[np.intp] = np.argmin(np.abs(predictions - y_arr[:, None]), axis=1)
        return best
