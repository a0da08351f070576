"""A mixture of k lines per key, fitted for many keys at once: :func:`fit_per_key`.

A recommender fits one small mixture per shared account: hundreds of thousands of data sets
of a few hundred rows each. A Python loop of estimator fits spends its time in overhead, so
here every step of classical AM runs for a whole batch of keys (and several random starts
of each) as one computation:

- keys of similar row counts make a batch, padded to its largest key: ``Z`` of shape
  (keys, rows, p), zero in the padding, which then adds nothing to any sum;
- every row carries the upper triangle of ``w wᵀ`` for ``w = (z, y)``; the normal equations
  of every (key, start, line) are the one-hot rows of the line times these products, one
  batched matrix product per step (the last line's sums by difference from the key's);
- the stack of normal equations is solved at once, by a Cholesky written entry by entry
  over all parts (:func:`_cholesky_by_entry`; the pseudo-inverse of
  :func:`solve_normal_equations` where it is ill conditioned);
- every row's residual to its key's lines, for every start, is one batched matrix product;
- a key whose starts all stop moving leaves the iterations: the later ones run on the keys
  still moving;
- every key draws its random numbers from its own generator (the fit's seed and the key's
  position): its fit does not depend on how the keys are cut into batches.

As in ``auto``, half the starts are least-squares lines of random partitions and half are
lines of a few random rows; every start runs :data:`SCREEN_ITERATIONS` iterations, the
:data:`SURVIVORS` best of each key go on to a fixed point (or ``max_iter``), and each key
keeps its best. Keys with too few rows for k lines get one least-squares line or are
skipped; keys with non-finite rows fail alone. A global model of all rows (the default
estimator) answers for keys the model does not know.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._estimator import MixtureOfLinearRegressions
from ._fit_warnings import minimum_rows_per_line
from ._loss import single_threaded_blas
from ._normal_equations import _WELL_CONDITIONED_PIVOT_RATIO, solve_normal_equations
from ._validation import as_generator

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

STATUSES = ("fitted", "k1", "skipped", "failed")
"""Per-key status: k lines fitted; one line (too few rows for k); skipped (too few rows, by
``small_keys="skip"``); failed (a non-finite feature or target in the key's rows)."""
MIN_N_INIT, MAX_N_INIT = 32, 200
"""Bounds on the random starts per key (half random partitions, half lines of random rows)."""
_ROWS_TIMES_STARTS = 3200
"""Rows times starts per key the default ``n_init`` aims at: tiny keys, whose min-loss has
many local minima among few rows, get many cheap starts; keys of hundreds of rows fewer
(their rounds of moves find what more starts would)."""
SCREEN_ITERATIONS = 5
SURVIVORS = 4
"""Starts of each key that go on after the screening iterations."""
RESEED_ROUNDS, RESEEDS = 3, 8
"""Rounds of moves from each key's best line set, and moves per round: one line replaced
by a line where the others fit worst (see :meth:`_Problem._reseeded`)."""
BATCH_ELEMENTS = 1 << 22
"""Bound on a batch's largest intermediate (rows * starts * lines * parameters floats):
keys are fitted in batches of whole keys whose rows fit in it (a key larger than it alone)."""
SMALL_SYSTEM_PARAMS, MANY_PARTS = 8, 256
"""Up to this many parameters and from this many parts, the normal equations of all parts of
a step are solved by a Cholesky factorization written entry by entry, each entry one vector
operation over the parts: several times faster than a batched LU of thousands of tiny
matrices (slower for a few parts, where its hundred calls cost more than the LU)."""
PADDING = 1.25
"""Most rows of a batch's keys over its fewest: every key is padded to the batch's largest,
so at most a fifth of a batch's rows is padding."""
LOSS_QUANTILES = (0.0, 0.5, 0.9, 0.99, 1.0)

SmallKeys = Literal["k1", "skip"]
Progress = Callable[[int, int], None]
"""Called with (keys done, keys in all) after every batch; raising from it stops the fit."""


class UnknownKeyError(KeyError):
    """Keys a keyed model has no lines for, asked with ``unknown="error"``."""

    def __init__(self, keys: list[Any]) -> None:
        super().__init__(keys)
        self.keys = keys

    def __str__(self) -> str:
        shown = ", ".join(repr(key) for key in self.keys[:5])
        more = f" and {len(self.keys) - 5} more" if len(self.keys) > 5 else ""
        return f"unknown keys: {shown}{more}"


@dataclass
class KeyedMixture:
    """Every key's lines, shares and min-loss, and a global model of all rows.

    Attributes
    ----------
    keys : ndarray of shape (n_keys,)
        Sorted distinct keys (integers or strings).
    coef : ndarray of shape (n_keys, n_components, n_features)
        A key fitted with one line (status ``"k1"``) has it in every slot; a skipped or
        failed key has zeros.
    intercept : ndarray of shape (n_keys, n_components)
    shares : ndarray of shape (n_keys, n_components)
        Share of the key's rows nearest each line (a ``"k1"`` key: 1 then zeros).
    min_loss : ndarray of shape (n_keys,)
        Training min-loss of each key (NaN where skipped or failed).
    n_rows : ndarray of shape (n_keys,)
    status : ndarray of shape (n_keys,)
        Indices into :data:`STATUSES`.
    global_model : MixtureOfLinearRegressions or None
        The default estimator fitted on all rows with finite values.
    rows_without_key : int
        Rows left out because their key was missing (None or NaN).
    """

    keys: NDArray[Any]
    coef: FloatArray
    intercept: FloatArray
    shares: FloatArray
    min_loss: FloatArray
    n_rows: IntArray
    status: NDArray[np.int8]
    global_model: MixtureOfLinearRegressions | None = None
    rows_without_key: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    """Reason of each failed key (its key as a string), for the first
    :data:`MAX_FAILURES_LISTED` failed keys."""

    @property
    def n_components(self) -> int:
        return int(self.coef.shape[1])

    @property
    def n_features(self) -> int:
        return int(self.coef.shape[2])

    def positions(self, keys: ArrayLike) -> NDArray[np.intp]:
        """Index of each key in :attr:`keys`; -1 where the key is unknown, skipped or failed.

        A binary search in the sorted key array: O(log n_keys) per key, no hashing.
        """
        asked = key_array(keys)
        text = "OU"
        if self.keys.dtype.kind in text and asked.dtype.kind in text + "iu":
            # Text keys (stored as fixed-width or Python strings) compare as text; never cast
            # to the stored width, which would cut a longer key down to a stored one.
            asked = asked.astype(str)
            if self.keys.dtype.kind == "O":
                asked = asked.astype(object)
        if self.keys.size == 0 or asked.size == 0 or asked.dtype.kind != self.keys.dtype.kind:
            return np.full(asked.shape[0], -1, dtype=np.intp)
        found = np.searchsorted(self.keys, asked)
        found = np.minimum(found, self.keys.size - 1)
        known = self.keys[found] == asked
        known &= self.status[found] <= STATUSES.index("k1")
        return np.where(known, found, -1)

    def predict(
        self, X: ArrayLike, keys: ArrayLike, unknown: Literal["global", "error"] = "global"
    ) -> FloatArray:
        """Every line's prediction for each row, from the lines of the row's key.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        keys : array-like of shape (n_samples,)
        unknown : {"global", "error"}, default="global"
            A key without lines (never seen, skipped or failed) is predicted by the global
            model, or raises :class:`UnknownKeyError` naming it.

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(
                f"X must have shape (n_samples, {self.n_features}), got {np.shape(X)}."
            )
        positions = self.positions(keys)
        if positions.shape[0] != X.shape[0]:
            raise ValueError(f"keys has {positions.shape[0]} entries for {X.shape[0]} rows.")
        missing = positions < 0
        if missing.any() and (unknown == "error" or self.global_model is None):
            raise UnknownKeyError(list(dict.fromkeys(key_array(keys)[missing].tolist())))
        found = np.where(missing, 0, positions)
        predictions: FloatArray = np.einsum("nd,nkd->nk", X, self.coef[found])
        predictions += self.intercept[found]
        if missing.any():
            assert self.global_model is not None
            predictions[missing] = self.global_model.predict(X[missing])
        return predictions

    def summary(self) -> dict[str, Any]:
        """Counts of keys by status, rows, failures and min-loss quantiles of fitted keys."""
        counts = np.bincount(self.status, minlength=len(STATUSES))
        losses = self.min_loss[np.isfinite(self.min_loss)]
        return {
            "n_keys": int(self.keys.size),
            "n_rows": int(self.n_rows.sum()),
            "rows_without_key": self.rows_without_key,
            "keys_by_status": {name: int(n) for name, n in zip(STATUSES, counts, strict=True)},
            "failures": dict(self.failures),
            "min_loss_quantiles": (
                {f"q{round(q * 100):02d}": float(np.quantile(losses, q)) for q in LOSS_QUANTILES}
                if losses.size
                else {}
            ),
        }


MAX_FAILURES_LISTED = 100
FAILURE_REASON = "a feature or the target is not a finite number"


def key_array(keys: ArrayLike) -> NDArray[Any]:
    """Keys as a 1-D array of integers or of strings."""
    array = np.asarray(keys)
    if array.ndim != 1:
        raise ValueError(f"keys must be one-dimensional, got shape {array.shape}.")
    if array.dtype.kind in "iu":
        return array.astype(np.int64, copy=False)
    if array.dtype.kind == "b":
        return array.astype(np.int64)
    if array.dtype.kind == "f":
        finite = array[np.isfinite(array)]
        if np.any(finite != np.round(finite)):
            raise ValueError("keys must be integers or strings; got non-integer numbers.")
        return array
    return array.astype(object)


def missing_keys(keys: NDArray[Any]) -> NDArray[np.bool_]:
    """Where ``keys`` (as :func:`key_array` gives them) is missing: NaN or None."""
    if keys.dtype.kind == "f":
        missing: NDArray[np.bool_] = ~np.isfinite(keys)
        return missing
    if keys.dtype == object:
        return np.fromiter((key is None for key in keys), dtype=bool, count=keys.size)
    return np.zeros(keys.shape[0], dtype=bool)


def fit_per_key(
    X: ArrayLike,
    y: ArrayLike,
    keys: ArrayLike,
    n_components: int = 2,
    *,
    fit_intercept: bool = True,
    n_init: int | None = None,
    max_iter: int = 100,
    small_keys: SmallKeys = "k1",
    global_model: bool = True,
    random_state: Any = None,
    progress: Progress | None = None,
) -> KeyedMixture:
    """Fit an independent mixture of ``n_components`` lines for every distinct key.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
    keys : array-like of shape (n_samples,)
        Integers or strings; rows with a missing key (None, NaN) are left out and counted.
    n_components : int, default=2
    fit_intercept : bool, default=True
    n_init : int or None, default=None
        Random starts per key (at least 2); None: 3200 divided by the median rows per key,
        between 32 and 200.
    max_iter : int, default=100
        Classical AM iterations per start at most.
    small_keys : {"k1", "skip"}, default="k1"
        A key with fewer rows than k lines need (``k * (n_features + 1)``) gets one line, or
        is skipped.
    global_model : bool, default=True
        Also fit the default estimator on all rows, for keys the model does not know.
    random_state : None, int or numpy.random.Generator
    progress : callable, optional
        Called with (keys done, keys in all) after each batch; an exception raised from it
        stops the fit and propagates.

    Returns
    -------
    KeyedMixture
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be two-dimensional, got shape {X.shape}.")
    if y.shape != (X.shape[0],):
        raise ValueError(f"y must have shape ({X.shape[0]},), got {y.shape}.")
    if isinstance(n_components, bool) or not isinstance(n_components, int) or n_components < 1:
        raise ValueError(f"n_components must be an integer >= 1, got {n_components!r}.")
    if n_init is not None and (
        isinstance(n_init, bool) or not isinstance(n_init, int) or n_init < 2
    ):
        raise ValueError(f"n_init must be an integer >= 2, got {n_init!r}.")
    if small_keys not in ("k1", "skip"):
        raise ValueError(f"small_keys must be 'k1' or 'skip', got {small_keys!r}.")
    key_values = key_array(keys)
    if key_values.shape[0] != X.shape[0]:
        raise ValueError(f"keys has {key_values.shape[0]} entries for {X.shape[0]} rows.")
    rng = as_generator(random_state)
    without_key = missing_keys(key_values)
    if without_key.any():
        keep = ~without_key
        X, y, key_values = X[keep], y[keep], key_values[keep]
    if key_values.dtype.kind == "f":
        key_values = key_values.astype(np.int64)
    distinct, codes = np.unique(key_values, return_inverse=True)
    order = np.argsort(codes, kind="stable")
    X, y, codes = X[order], y[order], codes[order].astype(np.intp)
    n_rows = np.bincount(codes, minlength=distinct.size).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(n_rows)])

    n_keys, n_features = distinct.size, X.shape[1]
    n_params = n_features + int(fit_intercept)
    finite_rows = np.isfinite(X).all(axis=1) & np.isfinite(y)
    failed = np.bincount(codes, weights=~finite_rows, minlength=n_keys) > 0
    enough = n_rows >= n_components * minimum_rows_per_line(n_params)
    status = np.where(enough, 0, 1 if small_keys == "k1" else 2).astype(np.int8)
    status[failed] = STATUSES.index("failed")
    if n_components == 1:
        status[status == 0] = 1

    result = KeyedMixture(
        keys=distinct,
        coef=np.zeros((n_keys, n_components, n_features)),
        intercept=np.zeros((n_keys, n_components)),
        shares=np.zeros((n_keys, n_components)),
        min_loss=np.full(n_keys, np.nan),
        n_rows=n_rows,
        status=status,
        rows_without_key=int(without_key.sum()),
        failures={
            str(distinct[key]): FAILURE_REASON
            for key in np.flatnonzero(failed)[:MAX_FAILURES_LISTED]
        },
    )
    if n_init is None:
        typical = float(np.median(n_rows)) if n_keys else 1.0
        n_init = int(np.clip(_ROWS_TIMES_STARTS // max(typical, 1.0), MIN_N_INIT, MAX_N_INIT))
    problem = _Problem(X, y, offsets, fit_intercept, n_components, int(rng.integers(2**63)))
    done = 0
    # Thousands of small batched products per batch: OpenBLAS's threads cost more than they
    # bring.
    with single_threaded_blas():
        for batch in _batches(n_rows, status, n_init * n_components * n_params):
            problem.fit_batch(batch, status[batch], result, n_init, max_iter)
            done += batch.size
            if progress is not None:
                progress(done, n_keys)
    if progress is not None and done < n_keys:
        progress(n_keys, n_keys)
    if global_model and finite_rows.any():
        result.global_model = MixtureOfLinearRegressions(
            n_components=n_components,
            fit_intercept=fit_intercept,
            random_state=int(rng.integers(0, 2**31 - 1)),
        ).fit(X[finite_rows], y[finite_rows])
    return result


def _batches(
    n_rows: IntArray, status: NDArray[np.int8], elements_per_row: int
) -> list[NDArray[np.intp]]:
    """Batches of fittable keys of one status and similar row counts.

    Keys go by increasing row count (k-line keys and one-line keys in batches of their own);
    a batch's keys have at most :data:`PADDING` times the rows of its smallest, and all are
    padded to its largest: at most :data:`BATCH_ELEMENTS` intermediate floats (a key larger
    than that alone).
    """
    batches: list[NDArray[np.intp]] = []
    rows_per_batch = max(1, BATCH_ELEMENTS // elements_per_row)
    for wanted in (STATUSES.index("fitted"), STATUSES.index("k1")):
        members = np.flatnonzero(status == wanted)
        members = members[np.argsort(n_rows[members], kind="stable")]
        sizes = n_rows[members]
        start = 0
        while start < members.size:
            similar = int(np.searchsorted(sizes, PADDING * sizes[start], side="right"))
            width = int(sizes[similar - 1])
            end = min(similar, start + max(1, rows_per_batch // width))
            batches.append(members[start:end])
            start = end
    return batches


class _Problem:
    """The sorted rows of all keys, and the batched steps of classical AM on some of them."""

    def __init__(
        self,
        X: FloatArray,
        y: FloatArray,
        offsets: IntArray,
        fit_intercept: bool,
        n_components: int,
        seed: int,
    ) -> None:
        self.X, self.y, self.offsets = X, y, offsets
        self.fit_intercept = fit_intercept
        self.n_components = n_components
        self.seed = seed

    def fit_batch(
        self,
        batch: NDArray[np.intp],
        status: NDArray[np.int8],
        result: KeyedMixture,
        n_init: int,
        max_iter: int,
    ) -> None:
        """Fit the keys ``batch`` (all of one status) into ``result``.

        Every key draws its random starts and moves from its own generator (seeded by the
        fit's seed and the key's position): a key's fit does not depend on the batch it is in.
        """
        n_batch = batch.size
        lengths = self.offsets[batch + 1] - self.offsets[batch]
        width = int(lengths.max())
        valid = np.arange(width) < lengths[:, None]
        # A padded slot reads its key's first row and is then zeroed: another key's row may
        # hold a NaN (a failed key), and zero times NaN is NaN.
        rows = self.offsets[batch, None] + np.where(valid, np.arange(width), 0)
        X = np.where(valid[:, :, None], self.X[rows], 0.0)
        y = np.where(valid, self.y[rows], 0.0)
        counts = lengths.astype(np.float64)
        # Centred per key: the normal equations stay well conditioned whatever the offsets.
        x_mean = np.zeros((n_batch, X.shape[2]))
        y_mean = np.zeros(n_batch)
        if self.fit_intercept:
            x_mean = X.sum(axis=1) / counts[:, None]
            y_mean = y.sum(axis=1) / counts
            X = np.where(valid[:, :, None], X - x_mean[:, None, :], 0.0)
            y = np.where(valid, y - y_mean[:, None], 0.0)
            Z = np.concatenate([X, valid[:, :, None].astype(np.float64)], axis=2)
        else:
            Z = X
        steps = _Steps(Z, y, valid)
        k = self.n_components
        if status[0] == STATUSES.index("k1"):
            theta = steps.solve_sums(steps.products.sum(axis=1), None)
            chosen = np.repeat(theta[:, None, :], k, axis=1)
            min_loss = steps.losses(chosen[:, None], exact=True)[0][:, 0]
            shares = np.zeros((n_batch, k))
            shares[:, 0] = 1.0
        else:
            generators = [np.random.default_rng([self.seed, int(key)]) for key in batch]
            starts = self._starts(steps, generators, n_init)
            theta, losses = self._search(steps, starts, max_iter)
            for _ in range(RESEED_ROUNDS):
                best = np.argmin(losses, axis=1)
                kept = theta[np.arange(n_batch), best]
                moved = np.concatenate(
                    [kept[:, None], self._reseeded(steps, generators, kept, RESEEDS)], axis=1
                )
                theta, losses = self._search(steps, moved, max_iter)
            chosen = theta[np.arange(n_batch), np.argmin(losses, axis=1)]
            chosen_losses, chosen_labels = steps.losses(chosen[:, None], exact=True)
            min_loss = chosen_losses[:, 0]
            nearest = (chosen_labels[:, 0, None, :] == np.arange(k)[:, None]) & valid[:, None, :]
            shares = nearest.sum(axis=2) / counts[:, None]
        coef = chosen[:, :, : X.shape[2]]
        intercept = chosen[:, :, -1] if self.fit_intercept else np.zeros((n_batch, k))
        result.coef[batch] = coef
        # Back from the key's centred data: b = mean(y) + b_centred - <mean(x), coef>.
        shift = y_mean[:, None] - np.einsum("kd,kjd->kj", x_mean, coef)
        result.intercept[batch] = intercept + shift
        result.shares[batch] = shares
        result.min_loss[batch] = min_loss

    @staticmethod
    def _search(steps: _Steps, starts: FloatArray, max_iter: int) -> tuple[FloatArray, FloatArray]:
        """Screen ``starts`` for a few iterations, then polish each key's best few."""
        theta, losses = steps.iterate(starts, SCREEN_ITERATIONS)
        survivors = np.argsort(losses, axis=1, kind="stable")[:, :SURVIVORS]
        theta = np.take_along_axis(theta, survivors[:, :, None, None], axis=1)
        return steps.iterate(theta, max_iter - SCREEN_ITERATIONS)

    def _reseeded(
        self,
        steps: _Steps,
        generators: list[np.random.Generator],
        theta: FloatArray,
        count: int,
    ) -> FloatArray:
        """``count`` line sets per key with one line replaced where the others fit worst.

        As :func:`mixreg._moves.reseed_by_residual`, for every key at once: the new line is
        the least-squares line of ``2 * n_params`` rows of the key drawn (with replacement)
        with probability proportional to their smallest squared residual, by inverting the
        running sum of these residuals over the key's rows (its padding weighs nothing).

        Parameters
        ----------
        theta : ndarray of shape (n_keys, k, p)

        Returns
        -------
        ndarray of shape (n_keys, count, k, p)
        """
        k = self.n_components
        n_keys, width = steps.valid.shape
        nearest, _ = steps.nearest(theta[:, None])
        weights = (nearest[:, 0] + np.finfo(np.float64).tiny * steps.valid).ravel()
        running = np.cumsum(weights)
        first = np.arange(n_keys) * width
        last = first + steps.lengths - 1
        before = running[first] - weights[first]
        totals = running[last] - before
        size = 2 * steps.n_params
        targets = (
            before[:, None, None]
            + np.stack([rng.random((count, size)) for rng in generators]) * totals[:, None, None]
        )
        picked = np.searchsorted(running, targets, side="right")
        picked = np.clip(picked, first[:, None, None], last[:, None, None])
        sums = steps.products.reshape(n_keys * width, -1)[picked].sum(axis=2)
        new_lines = steps.solve_sums(sums.reshape(-1, sums.shape[-1]), None).reshape(
            n_keys, count, steps.n_params
        )
        moved = np.repeat(theta[:, None], count, axis=1)
        replaced = np.stack([rng.integers(0, k, size=count) for rng in generators])
        moved[np.arange(n_keys)[:, None], np.arange(count)[None, :], replaced] = new_lines
        return moved

    def _starts(
        self, steps: _Steps, generators: list[np.random.Generator], n_init: int
    ) -> FloatArray:
        """Starting lines (n_keys, n_init, k, p): half of random partitions, half of random
        rows (each line of twice as many rows as it has parameters)."""
        k = self.n_components
        n_keys, width = steps.valid.shape
        n_partitions = n_init - n_init // 2
        # The padding's labels do not matter: its products are zero.
        labels = np.zeros((n_keys, n_partitions, width), dtype=np.min_scalar_type(k))
        for position, (rng, length) in enumerate(zip(generators, steps.lengths, strict=True)):
            labels[position, :, :length] = rng.integers(0, k, size=(n_partitions, length))
        previous = np.zeros((n_keys, n_partitions, k, steps.n_params))
        from_partitions = steps.solve(labels, previous)
        n_rows_starts = n_init // 2
        size = 2 * steps.n_params
        draws = np.stack([rng.random((n_rows_starts, k, size)) for rng in generators])
        picked = (np.arange(n_keys) * width)[:, None, None, None] + (
            draws * steps.lengths[:, None, None, None]
        ).astype(np.intp)
        sums = steps.products.reshape(n_keys * width, -1)[picked].sum(axis=3)
        from_rows = steps.solve_sums(sums.reshape(-1, sums.shape[-1]), None).reshape(
            n_keys, n_rows_starts, k, steps.n_params
        )
        return np.concatenate([from_partitions, from_rows], axis=1)


def _cholesky_by_entry(
    columns: FloatArray, position: NDArray[np.intp], usable: NDArray[np.bool_]
) -> tuple[FloatArray, NDArray[np.bool_]]:
    """Solve the equilibrated normal equations of many parts, one matrix entry at a time.

    Parameters
    ----------
    columns : ndarray of shape (n_entries, n_parts)
        Every part's summed products, one row per entry of the upper triangle of
        ``[Z, y]ᵀ[Z, y]``.
    position : ndarray of shape (p + 1, p + 1)
        The row of ``columns`` holding each entry (either triangle).
    usable : ndarray of shape (n_parts,)
        Parts whose Gram diagonal is positive; the others get garbage and are not solved.

    Returns
    -------
    theta : ndarray of shape (n_parts, p)
    solved : ndarray of shape (n_parts,)
        ``usable`` parts whose factorization is well conditioned (the smallest squared pivot
        of the equilibrated matrix above :data:`_WELL_CONDITIONED_PIVOT_RATIO` times the
        largest): the others need a pseudo-inverse.
    """
    p = position.shape[0] - 1
    diagonal = columns[np.diagonal(position)[:p]]
    scale = 1.0 / np.sqrt(np.where(usable, diagonal, 1.0))
    # factor[i][j] (j <= i) is the lower Cholesky factor's entry, a vector over the parts.
    factor: list[list[FloatArray]] = [[] for _ in range(p)]
    pivots = np.empty((p, columns.shape[1]))
    for j in range(p):
        for i in range(j, p):
            entry = columns[position[i, j]] * (scale[i] * scale[j])
            for c in range(j):
                entry -= factor[i][c] * factor[j][c]
            if i == j:
                pivots[j] = entry
                # A floor far below the accepted pivots keeps the parts that fail the check
                # finite (their answer is replaced).
                factor[j].append(np.sqrt(np.maximum(entry, _WELL_CONDITIONED_PIVOT_RATIO**2)))
            else:
                factor[i].append(entry / factor[j][j])
    solved = usable & (pivots.min(axis=0) > _WELL_CONDITIONED_PIVOT_RATIO * pivots.max(axis=0))
    forward: list[FloatArray] = []
    for i in range(p):
        entry = columns[position[i, p]] * scale[i]
        for c in range(i):
            entry -= factor[i][c] * forward[c]
        forward.append(entry / factor[i][i])
    backward: list[FloatArray] = [forward[0]] * p
    for i in reversed(range(p)):
        entry = forward[i]
        for c in range(i + 1, p):
            entry = entry - factor[c][i] * backward[c]
        backward[i] = entry / factor[i][i]
    theta: FloatArray = np.stack(backward, axis=1) * scale.T
    return theta, solved


class _Steps:
    """Classical AM for every key of a batch and every start at once.

    The keys' rows are padded to a common width: ``Z`` (n_keys, width, p), ``y`` (n_keys,
    width), zero in the padding, so that a padded slot adds nothing to any sum and has no
    residual. Every key's residuals to all its lines are then one batched matrix product,
    and so are the sums of the rows' products by (start, line).
    """

    def __init__(self, Z: FloatArray, y: FloatArray, valid: NDArray[np.bool_]) -> None:
        self.valid = valid
        self.n_params = Z.shape[2]
        self.lengths = valid.sum(axis=1)
        self.counts = self.lengths.astype(np.float64)
        p = self.n_params
        augmented = np.concatenate([Z, y[:, :, None]], axis=2)
        # Each row's (z, y)(z, y)ᵀ, upper triangle only, and a last column of 1 (0 in the
        # padding): the sums of a part's rows are its Gram matrix, Zᵀy and its row count.
        upper = np.triu_indices(p + 1)
        self.products = np.concatenate(
            [augmented[:, :, upper[0]] * augmented[:, :, upper[1]], valid[:, :, None]], axis=2
        )
        self.totals = self.products.sum(axis=1)
        self.full_of_upper = np.zeros((p + 1, p + 1), dtype=np.intp)
        self.full_of_upper[upper] = np.arange(upper[0].size)
        self.full_of_upper.T[upper] = np.arange(upper[0].size)
        self.Zyt = np.ascontiguousarray(augmented.transpose(0, 2, 1))
        self.Zyt32 = self.Zyt.astype(np.float32)

    def subset(self, keys: NDArray[np.intp]) -> _Steps:
        """The same steps on some of the keys only."""
        steps = object.__new__(_Steps)
        steps.valid = self.valid[keys]
        steps.n_params, steps.full_of_upper = self.n_params, self.full_of_upper
        steps.lengths, steps.counts = self.lengths[keys], self.counts[keys]
        steps.products, steps.Zyt = self.products[keys], self.Zyt[keys]
        steps.Zyt32 = self.Zyt32[keys]
        steps.totals = self.totals[keys]
        return steps

    def solve_sums(self, sums: FloatArray, previous: FloatArray | None) -> FloatArray:
        """Least-squares lines from summed products (n_parts, ...) as :attr:`products` has them.

        Parts with at least p rows are solved from their equilibrated normal equations: by
        :func:`_cholesky_by_entry` up to :data:`SMALL_SYSTEM_PARAMS` parameters and from
        :data:`MANY_PARTS` parts (where it is well conditioned), else by one batched LU (an
        ``eigh`` per part costs ten times more); fewer rows, an ill-conditioned or exactly
        singular system, by the pseudo-inverse of :func:`solve_normal_equations`. A part
        with no rows keeps its ``previous`` line (zeros when there is none).
        """
        p = self.n_params
        counts = sums[:, -1]
        diagonal = sums[:, np.diagonal(self.full_of_upper)[:p]]
        full = (counts >= p) & np.all(diagonal > 0, axis=1)
        theta = np.zeros((sums.shape[0], p))
        if p <= SMALL_SYSTEM_PARAMS and sums.shape[0] >= MANY_PARTS:
            theta, full = _cholesky_by_entry(np.ascontiguousarray(sums.T), self.full_of_upper, full)
        else:
            scale = 1.0 / np.sqrt(diagonal[full])
            blocks = sums[full][:, self.full_of_upper]
            equilibrated = blocks[:, :p, :p] * scale[:, :, None] * scale[:, None, :]
            try:
                solved = np.linalg.solve(equilibrated, (blocks[:, :p, p] * scale)[:, :, None])
                theta[full] = solved[:, :, 0] * scale
            except np.linalg.LinAlgError:
                full[:] = False
        if not full.all():
            blocks = sums[~full][:, self.full_of_upper]
            theta[~full] = solve_normal_equations(blocks[:, :p, :p], blocks[:, :p, p])
        if previous is not None:
            empty = counts == 0
            theta[empty] = previous.reshape(-1, p)[empty]
        return theta

    def solve(self, labels: NDArray[np.integer[Any]], previous: FloatArray) -> FloatArray:
        """Every (key, start, line)'s least-squares line from the rows ``labels`` give it.

        Parameters
        ----------
        labels : ndarray of shape (n_keys, n_starts, width)
        previous : ndarray of shape (n_keys, n_starts, k, p)
            Lines kept by parts that get no rows.

        Returns
        -------
        ndarray of shape (n_keys, n_starts, k, p)
        """
        n_keys, n_starts, k, _ = previous.shape
        width = labels.shape[2]
        # One-hot rows of every (start, line) but the last times the rows' products (the
        # padding's products are zero, whatever line it is given); the last line's sums are
        # the key's totals minus the others': a k-th fewer flops in the step's largest product.
        one_hot = labels[:, :, None, :] == np.arange(k - 1, dtype=labels.dtype)[:, None]
        sums = np.empty((n_keys, n_starts, k, self.products.shape[2]))
        sums[:, :, :-1] = (
            one_hot.reshape(n_keys, n_starts * (k - 1), width).astype(np.float64) @ self.products
        ).reshape(n_keys, n_starts, k - 1, -1)
        np.subtract(self.totals[:, None], sums[:, :, :-1].sum(axis=2), out=sums[:, :, -1])
        return self.solve_sums(sums.reshape(n_keys * n_starts * k, -1), previous).reshape(
            previous.shape
        )

    def nearest(
        self, theta: FloatArray, exact: bool = False
    ) -> tuple[NDArray[np.floating[Any]], NDArray[np.integer[Any]]]:
        """Every row's smallest squared residual to its key's lines, and that line, for every
        start: both of shape (n_keys, n_starts, width), the lines as the smallest integer
        type that holds them (less memory to move in every step). Ties go to the lower line.

        ``theta`` has shape (n_keys, n_starts, k, p). The residuals are single precision
        unless ``exact``: the steps move half the bytes, and a row whose two lines are
        within rounding of each other fits both alike; the lines are always solved, and the
        kept ones scored, in double precision.
        """
        n_keys, n_starts, k, p = theta.shape
        # (θ, -1) times (z, y): the residuals come out of the product itself.
        rows = self.Zyt if exact else self.Zyt32
        lines = np.full((n_keys, n_starts * k, p + 1), -1.0, dtype=rows.dtype)
        lines[:, :, :p] = theta.reshape(n_keys, n_starts * k, p)
        squared = lines @ rows
        np.square(squared, out=squared)
        by_line = squared.reshape(n_keys, n_starts, k, -1)
        labels = np.zeros((n_keys, n_starts, by_line.shape[3]), dtype=np.min_scalar_type(k))
        smallest = by_line[:, :, 0]
        for line in range(1, k):
            # Lines go up: a row closer to this one than to all before takes the larger label.
            closer = by_line[:, :, line] < smallest
            np.maximum(labels, closer * labels.dtype.type(line), out=labels)
            smallest = np.minimum(smallest, by_line[:, :, line])
        return smallest, labels

    def losses(
        self, theta: FloatArray, exact: bool = False
    ) -> tuple[FloatArray, NDArray[np.integer[Any]]]:
        """Min-loss of every (key, start) and every row's nearest line for each start."""
        nearest, labels = self.nearest(theta, exact)
        losses: FloatArray = nearest.sum(axis=2, dtype=np.float64) / self.counts[:, None]
        return losses, labels

    def iterate(self, theta: FloatArray, iterations: int) -> tuple[FloatArray, FloatArray]:
        """Up to ``iterations`` rounds of assign-then-refit, until no row changes its line.

        A key whose rows keep their lines in every start is at a fixed point and leaves
        the batch: the later rounds run on the keys still moving only.

        Returns the lines and the min-loss of each (key, start).
        """
        losses, labels = self.losses(theta)
        theta = theta.copy()
        moving = np.arange(theta.shape[0])
        steps, now_theta, now_losses, now_labels = self, theta, losses, labels
        for _ in range(iterations):
            refitted = steps.solve(now_labels, now_theta)
            new_losses, new_labels = steps.losses(refitted)
            # Classical AM never increases the min-loss; a refit that would (a pseudo-inverse
            # of a near-singular part, or rounding) is not taken, and that start stops where
            # it was.
            worse = new_losses > now_losses
            if worse.any():
                new_labels = np.where(worse[:, :, None], now_labels, new_labels)
                refitted = np.where(worse[:, :, None, None], now_theta, refitted)
                new_losses = np.minimum(new_losses, now_losses)
            changed = np.any(new_labels != now_labels, axis=(1, 2))
            now_theta, now_losses, now_labels = refitted, new_losses, new_labels
            if not changed.all():
                settled = ~changed
                theta[moving[settled]] = now_theta[settled]
                losses[moving[settled]] = now_losses[settled]
                if not changed.any():
                    return theta, losses
                kept = np.flatnonzero(changed)
                moving = moving[kept]
                steps = steps.subset(kept)
                now_theta, now_losses, now_labels = (
                    now_theta[kept],
                    now_losses[kept],
                    now_labels[kept],
                )
        theta[moving] = now_theta
        losses[moving] = now_losses
        return theta, losses
