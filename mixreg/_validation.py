"""Input and parameter checks with messages a user can act on."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]

ALGORITHMS = (
    "auto",
    "am",
    "am-classic",
    "subsample",
    "subsample-exhaustive",
    "subsample+am",
    "em",
)

# Each algorithm's parameters and their defaults (the paper's where it gives one).
# A parameter that is not listed for the chosen algorithm is an error.
ALGORITHM_PARAMETERS: dict[str, dict[str, Any]] = {
    "auto": {
        "n_init": None,
        "init": None,
        "max_iter": 100,
        "tol": 1e-6,
        "subsample_size": 150,
        "n_partitions": 1000,
        "time_budget": None,
    },
    "am": {
        "step_size": "auto",
        "max_iter": 100,
        "tol": 1e-6,
        "n_init": 1,
        "init": None,
        "time_budget": None,
    },
    "am-classic": {"max_iter": 100, "tol": 1e-6, "n_init": 1, "init": None, "time_budget": None},
    "subsample": {
        "subsample_size": 150,
        "n_partitions": 1000,
        "base": "ls",
        "time_budget": None,
    },
    "subsample-exhaustive": {"subsample_size": None, "base": "ls", "time_budget": None},
    "subsample+am": {
        "subsample_size": 150,
        "n_partitions": 1000,
        "base": "ls",
        "step_size": "auto",
        "max_iter": 100,
        "tol": 1e-6,
        "time_budget": None,
    },
    "em": {"max_iter": 200, "tol": 1e-6, "n_init": 1, "init": None, "time_budget": None},
}

PARAMETER_NAMES = (
    "step_size",
    "max_iter",
    "tol",
    "n_init",
    "init",
    "subsample_size",
    "n_partitions",
    "base",
    "time_budget",
)


def _as_float_array(value: ArrayLike, name: str) -> FloatArray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{name} must be an array of numbers (a rectangular list of lists for a matrix): {exc}"
        ) from None
    return array


def _check_finite(array: FloatArray, name: str) -> None:
    bad = ~np.isfinite(array)
    if bad.any():
        where = np.argwhere(bad)[0]
        index = "".join(f"[{int(i)}]" for i in where)
        value = array[tuple(where)]
        raise ValueError(f"{name}{index} is {value}; all values must be finite numbers")


def check_X(X: ArrayLike, *, n_features: int | None = None) -> FloatArray:
    """Return ``X`` as a finite float64 matrix of shape (n_samples, n_features)."""
    array = _as_float_array(X, "X")
    if array.ndim != 2:
        raise ValueError(
            f"X must be 2-dimensional (n_samples, n_features); got an array of shape {array.shape}"
        )
    if array.shape[0] == 0:
        raise ValueError("X has no rows")
    if array.shape[1] == 0:
        raise ValueError("X has no columns (features)")
    if n_features is not None and array.shape[1] != n_features:
        raise ValueError(
            f"X has {array.shape[1]} features, but the model was fitted with {n_features}"
        )
    _check_finite(array, "X")
    return np.ascontiguousarray(array)


def check_X_y(X: ArrayLike, y: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Return finite float64 ``X`` (n, d) and ``y`` (n,), or raise ValueError naming the problem."""
    X_arr = check_X(X)
    y_arr = _as_float_array(y, "y")
    if y_arr.ndim == 2 and y_arr.shape[1] == 1:
        y_arr = y_arr[:, 0]
    if y_arr.ndim != 1:
        raise ValueError(f"y must be 1-dimensional (n_samples,); got shape {y_arr.shape}")
    if y_arr.shape[0] != X_arr.shape[0]:
        raise ValueError(f"y has {y_arr.shape[0]} values but X has {X_arr.shape[0]} rows")
    _check_finite(y_arr, "y")
    return X_arr, np.ascontiguousarray(y_arr)


def check_concomitant(
    concomitant: ArrayLike, *, n_samples: int, n_columns: int | None = None
) -> FloatArray:
    """Return the gate's concomitant variables as a finite float64 matrix (n_samples, q)."""
    array = _as_float_array(concomitant, "concomitant")
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(
            f"concomitant must be 2-dimensional (n_samples, n_columns); got an array of shape "
            f"{array.shape}"
        )
    if array.shape[0] != n_samples:
        raise ValueError(f"concomitant has {array.shape[0]} rows but X has {n_samples}")
    if array.shape[1] == 0:
        raise ValueError("concomitant has no columns")
    if n_columns is not None and array.shape[1] != n_columns:
        raise ValueError(
            f"concomitant has {array.shape[1]} columns, but the gate was fitted on "
            f"{n_columns} columns"
        )
    _check_finite(array, "concomitant")
    return np.ascontiguousarray(array)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def _check_positive(name: str, value: Any, *, allow_zero: bool = False, also: str = "") -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not np.isfinite(float(value))
    ):
        alternative = f" {also}" if also else ""
        raise ValueError(f"{name} must be a finite number{alternative}; got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}; got {value}")
    return float(value)


def check_algorithm(algorithm: Any) -> str:
    """Return the algorithm name or raise with the list of valid ones."""
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown algorithm {algorithm!r}; choose one of {', '.join(map(repr, ALGORITHMS))}"
        )
    return str(algorithm)


def resolve_parameters(
    algorithm: str,
    given: dict[str, Any],
    *,
    n_components: int,
    n_samples: int,
    n_params: int,
) -> dict[str, Any]:
    """Check the parameters set for ``algorithm`` and fill in its defaults.

    Parameters
    ----------
    algorithm : str
    given : dict
        Every algorithm parameter of the estimator; ``None`` means "not set".
    n_components, n_samples : int
    n_params : int
        Columns of a line: features plus one when an intercept is fitted.

    Returns
    -------
    dict
        The algorithm's parameters with defaults filled in and values checked.
    """
    defaults = ALGORITHM_PARAMETERS[algorithm]
    foreign = [name for name, value in given.items() if value is not None and name not in defaults]
    if foreign:
        raise ValueError(
            f"parameter{'s' if len(foreign) > 1 else ''} {', '.join(map(repr, foreign))} "
            f"do{'' if len(foreign) > 1 else 'es'} not apply to algorithm {algorithm!r}, which "
            f"takes: {', '.join(defaults)}"
        )
    params = {
        name: given[name] if given.get(name) is not None else default
        for name, default in defaults.items()
    }
    if "step_size" in params and params["step_size"] != "auto":
        params["step_size"] = _check_positive("step_size", params["step_size"], also='or "auto"')
    if "max_iter" in params:
        params["max_iter"] = _check_int("max_iter", params["max_iter"], 1)
    if "tol" in params:
        params["tol"] = _check_positive("tol", params["tol"], allow_zero=True)
    if params.get("n_init") is not None:
        params["n_init"] = _check_int("n_init", params["n_init"], 1)
    if "n_partitions" in params:
        params["n_partitions"] = _check_int("n_partitions", params["n_partitions"], 1)
    if params.get("subsample_size") is not None:
        params["subsample_size"] = _check_int(
            "subsample_size", params["subsample_size"], n_components
        )
    if "base" in params and params["base"] not in ("ls", "ransac"):
        raise ValueError(f"base must be 'ls' or 'ransac'; got {params['base']!r}")
    if params.get("time_budget") is not None:
        params["time_budget"] = _check_positive("time_budget", params["time_budget"])
    if params.get("init") is not None:
        init = _as_float_array(params["init"], "init")
        if init.shape != (n_components, n_params):
            raise ValueError(
                f"init must have shape ({n_components}, {n_params}): one row per line with its "
                f"coefficients, followed by its intercept when fit_intercept=True; "
                f"got shape {init.shape}"
            )
        _check_finite(init, "init")
        # auto polishes the given lines as one more candidate beside its n_init random starts.
        if algorithm != "auto" and params["n_init"] not in (1, None):
            raise ValueError("init fixes the starting lines: n_init must be 1 when init is given")
        params["init"] = init
    return params


def check_sample_weight(sample_weight: ArrayLike, n_samples: int) -> FloatArray:
    """Return ``sample_weight`` as finite, non-negative float64 weights of ``n_samples`` rows.

    Raises ValueError naming ``sample_weight`` when a weight is negative, NaN or infinite,
    when the length differs from the rows', or when every weight is zero.
    """
    weights = _as_float_array(sample_weight, "sample_weight")
    if weights.ndim != 1:
        raise ValueError(
            f"sample_weight must be 1-dimensional (n_samples,); got shape {weights.shape}"
        )
    if weights.shape[0] != n_samples:
        raise ValueError(f"sample_weight has {weights.shape[0]} values but X has {n_samples} rows")
    _check_finite(weights, "sample_weight")
    negative = np.flatnonzero(weights < 0)
    if negative.size:
        raise ValueError(
            f"sample_weight[{int(negative[0])}] is {weights[negative[0]]}; weights must be >= 0"
        )
    if not (weights > 0).any():
        raise ValueError("sample_weight is zero for every row; at least one must be positive")
    return np.ascontiguousarray(weights)


def check_groups(groups: ArrayLike, n_samples: int) -> tuple[NDArray[Any], NDArray[np.intp]]:
    """The distinct group labels (sorted) and each row's index among them.

    Raises ValueError naming ``groups`` when its length differs from the rows', when it is
    not one-dimensional, or when a label is missing (None or NaN).
    """
    labels = np.asarray(groups)
    if labels.ndim != 1:
        raise ValueError(f"groups must be 1-dimensional (n_samples,); got shape {labels.shape}")
    if labels.shape[0] != n_samples:
        raise ValueError(f"groups has {labels.shape[0]} labels but X has {n_samples} rows")
    if labels.dtype.kind == "f":
        missing = np.flatnonzero(~np.isfinite(labels))
    elif labels.dtype.kind == "O":
        # None, or NaN (the one value that differs from itself), compared element by element.
        missing = np.flatnonzero((labels == None) | (labels != labels))  # noqa: E711
    else:
        missing = np.empty(0, dtype=np.intp)
    if missing.size:
        raise ValueError(f"groups[{int(missing[0])}] is missing; every row needs a group label")
    try:
        unique, codes = np.unique(labels, return_inverse=True)
    except TypeError as exc:
        raise ValueError(f"groups must be labels of one comparable type: {exc}") from None
    return unique, codes.astype(np.intp).ravel()


def as_generator(random_state: Any) -> np.random.Generator:
    """The one random generator of a fit.

    ``None`` gives fresh entropy, an int seeds a new generator, a ``Generator`` is used as is
    and a legacy ``RandomState`` seeds a new generator from its stream.
    """
    if random_state is None:
        return np.random.default_rng()
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        return np.random.default_rng(int(random_state))
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1, size=4))
    raise ValueError(
        f"random_state must be None, an int, a numpy Generator or RandomState; got {random_state!r}"
    )
