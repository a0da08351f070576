"""Property tests of mixreg's input validation: for any parameters and any data, ``fit`` either
fits finite lines or raises ``ValueError`` naming the problem (its documented error); nothing
else comes out, and nothing hangs (the test's timeout)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from mixreg import (
    ALGORITHM_PARAMETERS,
    ALGORITHMS,
    DegenerateFitWarning,
    MixtureOfLinearRegressions,
    min_loss,
)
from mixreg.service_support import check_n_components_list

pytestmark = pytest.mark.timeout(240)

PROPERTY = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ODD = st.sampled_from(
    [None, -1, 0, 1.5, "3", True, float("nan"), float("inf"), [2], "auto", 10**30]
)
EXTREME = st.sampled_from([0.0, 1e-300, 1e150, -1e200, float("nan"), float("inf"), -float("inf")])

# Values each parameter takes in a small, valid fit (a fit of a few milliseconds).
VALID = {
    "step_size": st.sampled_from(["auto", 0.1, 1.0]),
    "max_iter": st.integers(1, 5),
    "tol": st.sampled_from([0.0, 1e-3]),
    "n_init": st.integers(1, 3),
    "subsample_size": st.integers(1, 30),
    "n_partitions": st.integers(1, 20),
    "base": st.sampled_from(["ls", "ransac"]),
    "time_budget": st.sampled_from([None, 0.5, 5.0]),
}


@st.composite
def data(draw) -> tuple[object, object]:
    """Finite rows, mostly; sometimes a non-finite or extreme value, or arrays of a wrong
    shape."""
    n_rows, n_features = draw(st.integers(1, 25)), draw(st.integers(1, 3))
    X = np.array(
        draw(
            st.lists(
                st.floats(-100, 100), min_size=n_rows * n_features, max_size=n_rows * n_features
            )
        )
    ).reshape(n_rows, n_features)
    y = np.array(draw(st.lists(st.floats(-100, 100), min_size=n_rows, max_size=n_rows)))
    damage = draw(
        st.sampled_from(
            [
                "none",
                "none",
                "none",
                "extreme in X",
                "extreme in y",
                "y too short",
                "no rows",
                "no features",
                "X flat",
                "X cube",
                "y matrix",
            ]
        )
    )
    if damage == "extreme in X":
        X[draw(st.integers(0, n_rows - 1)), draw(st.integers(0, n_features - 1))] = draw(EXTREME)
    elif damage == "extreme in y":
        y[draw(st.integers(0, n_rows - 1))] = draw(EXTREME)
    elif damage == "y too short":
        y = y[:-1]
    elif damage == "no rows":
        X, y = X[:0], y[:0]
    elif damage == "no features":
        X = X[:, :0]
    elif damage == "X flat":
        X = X.ravel()
    elif damage == "X cube":
        X = X[..., None]
    elif damage == "y matrix":
        y = y[:, None]
    return X, y


@st.composite
def parameters(draw) -> dict[str, object]:
    """Valid parameters of an algorithm, mostly; sometimes one odd value, a parameter of
    another algorithm, an unknown algorithm, or starting lines of any shape."""
    algorithm = draw(st.sampled_from(ALGORITHMS))
    params: dict[str, object] = {"n_components": draw(st.integers(1, 3)), "random_state": 0}
    params["fit_intercept"] = draw(st.booleans())
    for name in ALGORITHM_PARAMETERS[algorithm]:
        if name in VALID and draw(st.booleans()):
            params[name] = draw(VALID[name])
    if algorithm == "auto":
        params["n_init"] = draw(VALID["n_init"])  # the default is 100 starts on small data
    if algorithm == "subsample-exhaustive":
        params["subsample_size"] = draw(st.integers(1, 8))
    damage = draw(
        st.sampled_from(["none", "none", "odd value", "foreign parameter", "algorithm", "init"])
    )
    if damage == "odd value":
        name = draw(st.sampled_from(["n_components", *ALGORITHM_PARAMETERS[algorithm]]))
        params[name] = draw(ODD)
    elif damage == "foreign parameter":
        params[draw(st.sampled_from(sorted(VALID)))] = draw(st.one_of(*VALID.values()))
    elif damage == "algorithm":
        params["algorithm"] = draw(st.sampled_from(["kmeans", "", 3, None]))
    elif damage == "init":
        k = draw(st.integers(1, 3))
        width = draw(st.integers(1, 4))
        params["init"] = draw(
            st.lists(
                st.lists(st.one_of(st.floats(-10, 10), EXTREME), min_size=width, max_size=width),
                min_size=k,
                max_size=k,
            )
        )
    return {"algorithm": algorithm, **params}


@PROPERTY
@given(parameters(), data())
def test_fit_fits_finite_lines_or_raises_value_error(params, arrays):
    X, y = arrays
    model = MixtureOfLinearRegressions(**params)
    with warnings.catch_warnings():
        # The documented warnings of an unconverged fit and of lines with too few rows (random
        # data of a few rows); any other warning fails the test.
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", DegenerateFitWarning)
        try:
            model.fit(X, y)
        except ValueError as exc:
            assert str(exc)
            with pytest.raises(NotFittedError):
                model.predict(X)
            return
        predictions = model.predict(X)
    k = model.coef_.shape[0]
    y_column = np.ravel(y)  # a (n, 1) y is accepted as a column, as scikit-learn does
    assert np.isfinite(model.coef_).all() and np.isfinite(model.intercept_).all()
    assert predictions.shape == (len(y_column), k) and np.isfinite(predictions).all()
    assert np.isfinite(min_loss(y_column, predictions))


@PROPERTY
@given(
    st.one_of(
        st.lists(st.one_of(st.integers(-3, 30), st.floats(), st.text(max_size=2)), max_size=6),
        ODD,
    )
)
def test_a_list_of_k_is_checked_or_refused_with_value_error(values):
    try:
        checked = check_n_components_list(values)
    except ValueError as exc:
        assert str(exc)
        return
    assert checked and all(isinstance(k, int) and k >= 1 for k in checked)
    assert len(set(checked)) == len(checked)
