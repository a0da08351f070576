"""The JSON document of a fitted mixture: to_dict, json, from_dict gives the same predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mixreg import MixtureOfLinearRegressions


@pytest.fixture(scope="module")
def fitted() -> MixtureOfLinearRegressions:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 3)) * [1.0, 1e3, 1e-3]
    labels = rng.integers(0, 2, size=200)
    y = np.where(labels, X @ [1.0, 2e-3, 500.0] + 0.5, X @ [-2.0, 1e-3, -300.0] - 0.25)
    return MixtureOfLinearRegressions(2, algorithm="am-classic", random_state=4).fit(X, y)


def test_a_round_trip_through_json_predicts_bit_for_bit(fitted):
    document = json.loads(json.dumps(fitted.to_dict(feature_names=["a", "b", "c"])))
    assert (document["format"], document["format_version"]) == ("mixreg-model", 1)
    assert document["feature_names"] == ["a", "b", "c"] and document["gate"] is None
    assert document["params"]["random_state"] == 4
    restored = MixtureOfLinearRegressions.from_dict(document)
    X = np.random.default_rng(1).standard_normal((50, 3)) * 1e3
    np.testing.assert_array_equal(restored.predict(X), fitted.predict(X))
    np.testing.assert_array_equal(restored.coef_, fitted.coef_)
    assert restored.get_params() == {**fitted.get_params()}


def test_members_a_service_adds_are_ignored(fitted):
    document = {**fitted.to_dict(), "metrics": {"train_min_loss": 1.0}, "provenance": {}}
    restored = MixtureOfLinearRegressions.from_dict(document)
    np.testing.assert_array_equal(restored.intercept_, fitted.intercept_)


def test_an_unfitted_estimator_has_no_document():
    with pytest.raises(Exception, match="not fitted"):
        MixtureOfLinearRegressions().to_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "pickle"}, "not a model document"),
        ({"format_version": 2}, "format_version 2 cannot be read"),
        ({"coef": [[1.0, 2.0]]}, "'coef' must have shape (2, 3)"),
        ({"intercept": [1.0, float("nan")]}, "'intercept' must hold finite numbers"),
        ({"shares": [0.9, 0.9]}, "'shares' must be fractions that add up to 1"),
        ({"feature_names": ["a"]}, "'feature_names' must be 3 names"),
        ({"n_components": True}, "'n_components' must be a positive integer"),
        ({"gate": {"concomitant": "g"}}, "'gate.concomitant' must be null"),
        ({"gate": {"concomitant": None}}, "has no 'noise_variance'"),
        ({"gate": [1.0]}, "'gate' must be an object or null"),
    ],
)
def test_a_bad_document_is_refused_naming_what_is_wrong(fitted, change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MixtureOfLinearRegressions.from_dict({**fitted.to_dict(), **change})
