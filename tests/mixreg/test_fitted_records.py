"""A refit leaves no optional sub-result of an earlier fit behind (mixreg._fitted)."""

import warnings

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions
from mixreg._fitted import OPTIONAL_RESULTS, GateFit, GroupedFit, MixtureFit, StandardErrors


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(3)
    n = 240
    X = rng.normal(size=(n, 1))
    lines = rng.integers(0, 2, n)
    y = np.where(lines, 2.0 * X[:, 0] + 1.0, -1.5 * X[:, 0] - 1.0) + 0.2 * rng.normal(size=n)
    return X, y, np.repeat(np.arange(n // 4), 4)


def _attributes(record: type) -> set[str]:
    return set(record.__dataclass_fields__)


def _present(estimator, record: type) -> set[str]:
    return {name for name in _attributes(record) if hasattr(estimator, name)}


def test_a_gated_fit_with_errors_sets_every_gate_and_error_attribute(rows):
    X, y, _ = rows
    estimator = MixtureOfLinearRegressions(2, gating=True, standard_errors=True, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator.fit(X, y)
    assert _present(estimator, GateFit) == _attributes(GateFit)
    assert _present(estimator, StandardErrors) == _attributes(StandardErrors)
    # A gated fit's maximum-likelihood lines are its lines; it has no EM start of its own.
    assert _present(estimator, MixtureFit) == _attributes(MixtureFit) - {"ml_start_"}


def test_a_plain_refit_removes_the_gate_errors_and_groups_of_earlier_fits(rows):
    X, y, groups = rows
    estimator = MixtureOfLinearRegressions(2, gating=True, standard_errors=True, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator.fit(X, y)
        estimator.set_params(gating=False, standard_errors=False, algorithm="em").fit(
            X, y, groups=groups
        )
    assert _present(estimator, GroupedFit) == _attributes(GroupedFit)
    assert _present(estimator, GateFit) == {"weights_", "noise_variance_"}  # EM's own
    assert _present(estimator, StandardErrors) == set()
    estimator.set_params(algorithm="am-classic").fit(X, y)
    for record in OPTIONAL_RESULTS:
        assert _present(estimator, record) == set(), record.__name__
    assert hasattr(estimator, "coef_")


def test_a_record_sets_only_the_fields_it_holds():
    class Target:
        pass

    target = Target()
    MixtureFit(ml_coef_=np.ones((2, 1)), ml_intercept_=np.zeros(2)).set_on(target)
    assert _present(target, MixtureFit) == {"ml_coef_", "ml_intercept_"}
    MixtureFit.remove_from(target)
    assert _present(target, MixtureFit) == set()
