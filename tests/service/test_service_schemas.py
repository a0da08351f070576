"""Request schemas: one params model per algorithm with mixreg's defaults, strict unions."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from mixreg import ALGORITHM_PARAMETERS, ALGORITHMS
from service.config import Settings
from service.fitting import request_hash
from service.main import create_app
from service.schemas import PARAMS_MODELS, FitRequest

fit_request = TypeAdapter(FitRequest)


def test_there_is_one_params_model_per_mixreg_algorithm():
    assert sorted(PARAMS_MODELS) == sorted(ALGORITHMS)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_PARAMETERS))
def test_params_defaults_are_mixregs(algorithm):
    # time_budget is the request's top-level time_budget_s, shared by every algorithm.
    expected = {
        name: default
        for name, default in ALGORITHM_PARAMETERS[algorithm].items()
        if name != "time_budget"
    }
    assert PARAMS_MODELS[algorithm]().model_dump() == expected


def test_algorithm_defaults_to_subsample_plus_am_with_its_params():
    request = fit_request.validate_python({"dataset_id": "d", "k": 3})
    assert request.algorithm == "subsample+am"
    assert request.n_components == 3
    assert request.params_dict == {
        name: value
        for name, value in ALGORITHM_PARAMETERS["subsample+am"].items()
        if name != "time_budget"
    }
    assert (request.fit_intercept, request.holdout_fraction, request.seed) == (True, 0.2, 0)


def test_n_components_and_k_are_the_same_field():
    by_name = fit_request.validate_python({"dataset_id": "d", "n_components": 2})
    by_alias = fit_request.validate_python({"dataset_id": "d", "k": 2})
    assert by_name == by_alias
    assert request_hash(by_name) == request_hash(by_alias)


def test_explicit_defaults_hash_like_omitted_ones():
    implicit = fit_request.validate_python({"dataset_id": "d", "k": 2, "algorithm": "em"})
    explicit = fit_request.validate_python(
        {"dataset_id": "d", "k": 2, "algorithm": "em", "params": {"max_iter": 200}, "seed": 0}
    )
    assert request_hash(implicit) == request_hash(explicit)
    different = fit_request.validate_python(
        {"dataset_id": "d", "k": 2, "algorithm": "em", "seed": 1}
    )
    assert request_hash(different) != request_hash(implicit)


@pytest.mark.parametrize(
    ("algorithm", "foreign"),
    [
        ("am", "n_partitions"),
        ("subsample", "step_size"),
        ("em", "base"),
        ("subsample-exhaustive", "n_partitions"),
        ("am-classic", "step_size"),
        ("subsample+am", "init"),
    ],
)
def test_a_parameter_of_another_algorithm_is_rejected(algorithm, foreign):
    with pytest.raises(ValidationError) as error:
        fit_request.validate_python(
            {"dataset_id": "d", "k": 2, "algorithm": algorithm, "params": {foreign: 1}}
        )
    [problem] = error.value.errors()
    assert problem["type"] == "unknown_parameter"
    known = ", ".join(PARAMS_MODELS[algorithm].model_fields)
    assert problem["msg"] == (
        f"params.{foreign} is not a parameter of algorithm '{algorithm}'; "
        f"its parameters are {known}"
    )


@pytest.mark.parametrize(
    ("params", "location"),
    [
        ({"step_size": 0}, ("am", "params", "step_size")),
        ({"max_iter": 0}, ("am", "params", "max_iter")),
        ({"tol": -1}, ("am", "params", "tol")),
        ({"n_init": 0}, ("am", "params", "n_init")),
        ({"init": [[1.0, float("nan")]]}, ("am", "params", "init")),
    ],
)
def test_parameter_ranges(params, location):
    with pytest.raises(ValidationError) as error:
        fit_request.validate_python(
            {"dataset_id": "d", "k": 1, "algorithm": "am", "params": params}
        )
    assert error.value.errors()[0]["loc"] == location


def test_openapi_documents_each_algorithms_parameters():
    spec = create_app(Settings(database_url="sqlite://", embedded_worker=False)).openapi()
    schemas = spec["components"]["schemas"]
    for algorithm, model in PARAMS_MODELS.items():
        documented = schemas[model.__name__]
        assert set(documented["properties"]) == set(model.model_fields), algorithm
        assert documented["additionalProperties"] is False
    assert schemas["SubsampleParams"]["properties"]["n_partitions"]["default"] == 1000
    body = spec["paths"]["/fit"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    variants = {ref["$ref"].rsplit("/", 1)[1] for ref in body["oneOf"]}
    assert variants == {
        "AmFit",
        "AmClassicFit",
        "SubsampleFit",
        "SubsampleExhaustiveFit",
        "SubsampleAmFit",
        "EmFit",
    }
    operation_ids = {
        operation["operationId"] for path in spec["paths"].values() for operation in path.values()
    }
    assert {"fit-submit", "jobs-cancel", "models-predict", "predict-predict"} <= operation_ids
