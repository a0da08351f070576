"""The scikit-learn estimator contract and the input checks, with their messages."""

import re

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import (
    check_get_params_invariance,
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
    check_set_params,
)

from mixreg import (
    ALGORITHM_PARAMETERS,
    ALGORITHMS,
    MixtureOfLinearRegressions,
    min_loss,
)
from mixreg.datasets import make_realizable

INIT_PARAMETERS = (
    "n_components",
    "algorithm",
    "fit_intercept",
    "random_state",
    "step_size",
    "max_iter",
    "tol",
    "n_init",
    "init",
    "subsample_size",
    "n_partitions",
    "base",
    "time_budget",
    "standard_errors",
    "gating",
)


@pytest.fixture(scope="module")
def data():
    X, y, *_ = make_realizable(120, 2, 2, noise=0.1, random_state=0)
    return X, y


def quick(**params):
    """An estimator that fits the module's data in milliseconds."""
    settings = {"n_components": 2, "algorithm": "am-classic", "random_state": 0, "max_iter": 20}
    settings.update(params)
    return MixtureOfLinearRegressions(**settings)


@pytest.fixture(scope="module")
def fitted(data):
    return quick().fit(*data)


def test_get_params_lists_every_parameter_and_set_params_round_trips():
    estimator = MixtureOfLinearRegressions(3, algorithm="subsample", n_partitions=50, base="ransac")
    params = estimator.get_params()
    assert set(params) == set(INIT_PARAMETERS)
    assert params["n_components"] == 3 and params["n_partitions"] == 50
    other = MixtureOfLinearRegressions().set_params(**params)
    assert other.get_params() == params
    assert estimator.set_params(algorithm="em", n_partitions=None) is estimator
    assert estimator.algorithm == "em" and estimator.n_partitions is None


def test_set_params_rejects_an_unknown_name():
    with pytest.raises(ValueError, match="n_lines"):
        MixtureOfLinearRegressions().set_params(n_lines=3)


def test_scikit_learn_parameter_checks_pass():
    name = MixtureOfLinearRegressions.__name__
    check_parameters_default_constructible(name, MixtureOfLinearRegressions())
    check_no_attributes_set_in_init(name, MixtureOfLinearRegressions())
    check_get_params_invariance(name, MixtureOfLinearRegressions())
    check_set_params(name, MixtureOfLinearRegressions())


def test_init_only_stores_the_parameters():
    init = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    estimator = MixtureOfLinearRegressions(algorithm="nonsense", n_components=-1, init=init)
    assert estimator.init is init
    assert set(vars(estimator)) == set(INIT_PARAMETERS)


def test_clone_gives_an_unfitted_estimator_with_equal_params(fitted):
    init = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 1.0]])
    for original in (fitted, quick(algorithm="am", init=init, step_size=0.3)):
        copy = clone(original)
        assert copy is not original
        assert not hasattr(copy, "coef_")
        original_params, copy_params = original.get_params(), copy.get_params()
        assert set(original_params) == set(copy_params)
        for name, value in original_params.items():
            np.testing.assert_array_equal(copy_params[name], value)
        with pytest.raises(NotFittedError):
            copy.predict(np.zeros((1, 2)))


def test_fit_returns_self_and_sets_only_trailing_underscore_attributes(data):
    estimator = quick()
    assert estimator.fit(*data) is estimator
    learned = set(vars(estimator)) - set(INIT_PARAMETERS)
    assert learned, "fit stored nothing"
    assert all(name.endswith("_") and not name.startswith("_") for name in learned), learned
    for name in (
        "coef_",
        "intercept_",
        "shares_",
        "loss_history_",
        "n_iter_",
        "n_features_in_",
        "train_loss_",
        "converged_",
        "n_candidates_",
    ):
        assert name in learned


def test_fit_does_not_change_the_parameters(data):
    init = np.array([[2.0, 0.0, 1.0], [-1.0, 1.0, 0.0]])
    estimator = quick(algorithm="am", init=init)
    before = {name: np.copy(value) for name, value in estimator.get_params().items()}
    estimator.fit(*data)
    assert estimator.init is init
    for name, value in estimator.get_params().items():
        np.testing.assert_array_equal(value, before[name])


def test_predict_before_fit_raises_not_fitted():
    estimator = MixtureOfLinearRegressions()
    with pytest.raises(NotFittedError, match="fit"):
        estimator.predict(np.zeros((2, 2)))
    with pytest.raises(NotFittedError):
        estimator.min_loss(np.zeros((2, 2)), np.zeros(2))


def test_predict_gives_one_column_per_line(data, fitted):
    X, _ = data
    predictions = fitted.predict(X[:7])
    assert predictions.shape == (7, 2)
    np.testing.assert_allclose(predictions, X[:7] @ fitted.coef_.T + fitted.intercept_)
    np.testing.assert_allclose(fitted.predict(X[:3].tolist()), predictions[:3])


def test_min_loss_method_equals_the_function_on_predictions(data, fitted):
    X, y = data
    assert fitted.min_loss(X, y) == pytest.approx(min_loss(y, fitted.predict(X)), rel=1e-14)
    X_new, y_new, *_ = make_realizable(30, 2, 2, noise=1.0, random_state=9)
    assert fitted.min_loss(X_new, y_new) == pytest.approx(
        min_loss(y_new, fitted.predict(X_new)), rel=1e-14
    )


def test_integer_inputs_and_a_column_target_are_accepted(data):
    X, y = data
    integer = quick().fit(np.round(X * 10).astype(int), np.round(y * 10).astype(int))
    assert integer.coef_.dtype == np.float64
    column = quick().fit(X, y[:, None])
    flat = quick().fit(X, y)
    np.testing.assert_array_equal(column.coef_, flat.coef_)


def test_resolved_parameters_fill_in_the_defaults():
    for algorithm in ALGORITHMS:
        params = MixtureOfLinearRegressions(algorithm=algorithm).resolved_parameters(500, 3)
        assert set(params) == set(ALGORITHM_PARAMETERS[algorithm])
        for name, default in ALGORITHM_PARAMETERS[algorithm].items():
            if default is not None:
                assert params[name] == default
    params = MixtureOfLinearRegressions(algorithm="am", step_size=0.5).resolved_parameters(50, 1)
    assert params["step_size"] == 0.5


def fit_error(data, estimator=None, X=None, y=None):
    """The message of the ValueError that fit raises."""
    X_data, y_data = data
    estimator = estimator if estimator is not None else quick()
    with pytest.raises(ValueError) as raised:
        estimator.fit(X_data if X is None else X, y_data if y is None else y)
    return str(raised.value)


def test_x_with_the_wrong_number_of_dimensions(data):
    _, y = data
    message = fit_error(data, X=np.zeros(120), y=y)
    assert "X must be 2-dimensional" in message and "(120,)" in message
    message = fit_error(data, X=np.zeros((120, 2, 2)))
    assert "X must be 2-dimensional" in message and "(120, 2, 2)" in message


def test_ragged_x(data):
    message = fit_error(data, X=[[1.0, 2.0], [3.0]], y=[1.0, 2.0])
    assert "X must be an array of numbers" in message and "rectangular" in message


def test_non_numeric_x(data):
    message = fit_error(data, X=[["a", "b"], ["c", "d"]], y=[1.0, 2.0])
    assert "X must be an array of numbers" in message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_x_names_the_position(data, bad):
    X, _ = data
    X = X.copy()
    X[17, 1] = bad
    message = fit_error(data, X=X)
    assert "X[17][1]" in message and "finite" in message


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_y_names_the_position(data, bad):
    _, y = data
    y = y.copy()
    y[42] = bad
    message = fit_error(data, y=y)
    assert "y[42]" in message and "finite" in message


def test_y_length_mismatch(data):
    _, y = data
    message = fit_error(data, y=y[:100])
    assert "y has 100 values but X has 120 rows" in message


def test_y_with_several_columns(data):
    _, y = data
    message = fit_error(data, y=np.column_stack([y, y]))
    assert "y must be 1-dimensional" in message


def test_empty_x(data):
    message = fit_error(data, X=np.zeros((0, 2)), y=np.zeros(0))
    assert "no rows" in message


def test_fewer_rows_than_components(data):
    X, y = data
    message = fit_error(data, quick(n_components=5), X=X[:3], y=y[:3])
    assert "n_components=5" in message and "3 training rows" in message


@pytest.mark.parametrize("n_components", [0, -2, 2.5, "2", True, None])
def test_n_components_must_be_a_positive_integer(data, n_components):
    message = fit_error(data, quick(n_components=n_components))
    assert "n_components must be an integer >= 1" in message
    assert repr(n_components) in message


def test_unknown_algorithm_lists_the_valid_ones(data):
    message = fit_error(data, quick(algorithm="kmeans"))
    assert "'kmeans'" in message
    for algorithm in ALGORITHMS:
        assert repr(algorithm) in message


@pytest.mark.parametrize(
    ("algorithm", "parameter", "value"),
    [
        ("em", "n_partitions", 10),
        ("am", "base", "ls"),
        ("subsample", "step_size", 0.1),
        ("subsample+am", "n_init", 3),
        ("am-classic", "step_size", 0.5),
        ("subsample-exhaustive", "n_partitions", 10),
    ],
)
def test_a_parameter_of_another_algorithm_is_refused(data, algorithm, parameter, value):
    estimator = MixtureOfLinearRegressions(2, algorithm=algorithm, **{parameter: value})
    message = fit_error(data, estimator)
    assert repr(parameter) in message and repr(algorithm) in message
    # The message says which parameters the algorithm does take.
    for accepted in ALGORITHM_PARAMETERS[algorithm]:
        assert accepted in message


def test_several_foreign_parameters_are_all_named(data):
    estimator = MixtureOfLinearRegressions(2, algorithm="em", n_partitions=10, base="ransac")
    message = fit_error(data, estimator)
    assert "'n_partitions'" in message and "'base'" in message


def test_bad_base(data):
    message = fit_error(data, quick(algorithm="subsample", base="huber", max_iter=None))
    assert "base must be 'ls' or 'ransac'" in message and "'huber'" in message


@pytest.mark.parametrize("step_size", [-0.1, 0.0, np.inf, "big"])
def test_bad_step_size(data, step_size):
    message = fit_error(data, quick(algorithm="am", step_size=step_size))
    assert "step_size" in message
    assert re.search(r"> 0|finite number", message)


@pytest.mark.parametrize(
    ("parameter", "value", "expected"),
    [
        ("max_iter", 0, "max_iter must be >= 1"),
        ("max_iter", 2.5, "max_iter must be an integer"),
        ("tol", -1e-3, "tol must be >= 0"),
        ("n_init", 0, "n_init must be >= 1"),
        ("time_budget", -1.0, "time_budget must be > 0"),
    ],
)
def test_bad_iteration_settings(data, parameter, value, expected):
    message = fit_error(data, quick(algorithm="am", **{parameter: value}))
    assert expected in message


def test_subsample_size_smaller_than_k(data):
    estimator = MixtureOfLinearRegressions(3, algorithm="subsample", subsample_size=2)
    message = fit_error(data, estimator)
    assert "subsample_size must be >= 3" in message


def test_init_of_the_wrong_shape(data):
    message = fit_error(data, quick(algorithm="am", init=np.zeros((2, 2))))
    assert "init must have shape (2, 3)" in message and "(2, 2)" in message
    no_intercept = quick(algorithm="am", init=np.zeros((2, 3)), fit_intercept=False)
    assert "init must have shape (2, 2)" in fit_error(data, no_intercept)


def test_non_finite_init(data):
    init = np.zeros((2, 3))
    init[1, 2] = np.nan
    message = fit_error(data, quick(algorithm="am", init=init))
    assert "init[1][2]" in message


def test_n_init_above_one_with_init(data):
    message = fit_error(data, quick(algorithm="em", init=np.zeros((2, 3)), n_init=3))
    assert "n_init must be 1 when init is given" in message


def test_bad_fit_intercept(data):
    message = fit_error(data, quick(fit_intercept="yes"))
    assert "fit_intercept must be True or False" in message


def test_bad_random_state(data):
    message = fit_error(data, quick(random_state="seed"))
    assert "random_state must be" in message


def test_predict_with_the_wrong_feature_count(data, fitted):
    with pytest.raises(ValueError, match="X has 3 features, but the model was fitted with 2"):
        fitted.predict(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="X has 1 features"):
        fitted.min_loss(np.zeros((4, 1)), np.zeros(4))


def test_predict_with_non_finite_x(fitted):
    X = np.zeros((3, 2))
    X[2, 0] = np.nan
    with pytest.raises(ValueError, match=re.escape("X[2][0] is nan")):
        fitted.predict(X)


def test_best_component_is_the_closest_line(data, fitted):
    X, y = data
    best = fitted.best_component(X, y)
    np.testing.assert_array_equal(best, np.argmin(np.abs(fitted.predict(X) - y[:, None]), axis=1))
    np.testing.assert_allclose(np.bincount(best, minlength=2) / len(y), fitted.shares_)


@pytest.mark.parametrize("x_scale", [1e-200, 1e200])
def test_extreme_feature_scales_give_the_same_lines(x_scale):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    on_first = rng.integers(0, 2, size=200).astype(bool)
    y = np.where(on_first, X @ [1.0, 2.0] + 1.0, X @ [-2.0, 1.0] - 1.0)
    plain = MixtureOfLinearRegressions(2, algorithm="am-classic", random_state=0).fit(X, y)
    scaled = MixtureOfLinearRegressions(2, algorithm="am-classic", random_state=0)
    scaled.fit(X * x_scale, y)
    np.testing.assert_allclose(scaled.coef_ * x_scale, plain.coef_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(scaled.intercept_, plain.intercept_, rtol=1e-9, atol=1e-9)


def test_targets_whose_squares_overflow_are_refused():
    X = np.arange(20.0).reshape(10, 2)
    y = np.full(10, 1e200)
    with pytest.raises(ValueError, match=r"\|y\| reaches 1e\+200: squared errors .* scale y down"):
        MixtureOfLinearRegressions(2).fit(X, y)
