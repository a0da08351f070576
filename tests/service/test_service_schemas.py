"""Request schemas: one params model per algorithm with mixreg's defaults, strict unions."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from mixreg import ALGORITHM_PARAMETERS, ALGORITHMS
from service.config import Settings
from service.fit_schemas import PARAMS_MODELS, FitRequest
from service.jobs.submit import request_hash
from service.main import create_app

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


def test_algorithm_defaults_to_auto_with_its_params():
    request = fit_request.validate_python({"dataset_id": "d", "k": 3})
    assert request.algorithm == "auto"
    assert request.n_components == 3
    assert request.params_dict == {
        name: value for name, value in ALGORITHM_PARAMETERS["auto"].items() if name != "time_budget"
    }
    # n_init None: the size-aware default, resolved when the fit is submitted.
    assert request.params_dict["n_init"] is None
    assert (request.fit_intercept, request.holdout_fraction, request.seed) == (True, 0.2, 0)


@pytest.mark.parametrize("algorithm", ["am", "subsample+am"])
def test_step_size_is_auto_or_a_positive_number(algorithm):
    def step_size(value):
        body = {"dataset_id": "d", "k": 2, "algorithm": algorithm}
        if value is not None:
            body["params"] = {"step_size": value}
        return fit_request.validate_python(body).params_dict["step_size"]

    assert step_size(None) == "auto"
    assert step_size("auto") == "auto"
    assert step_size(0.25) == 0.25
    assert step_size(2) == 2.0
    for bad, message in [
        (0, "Input should be greater than 0"),
        (-1.0, "Input should be greater than 0"),
        ("fast", 'Input should be a positive number or "auto"'),
        (True, 'Input should be a positive number or "auto"'),
        (float("inf"), "Input should be a finite number"),
    ]:
        with pytest.raises(ValidationError) as error:
            step_size(bad)
        [problem] = error.value.errors()
        assert problem["loc"] == (algorithm, "params", "step_size")
        assert problem["msg"] == message


def test_a_list_of_k_is_a_sweep_in_increasing_order():
    request = fit_request.validate_python({"dataset_id": "d", "k": [3, 1, 2]})
    assert request.n_components == [1, 2, 3]
    same = fit_request.validate_python({"dataset_id": "d", "n_components": [1, 2, 3]})
    assert request_hash(request) == request_hash(same)


@pytest.mark.parametrize(
    ("k", "message"),
    [
        ([], "n_components is an empty list; give at least one number of lines"),
        ([1, 2, 2], "n_components lists k=2 twice; give each k once"),
        ([0, 1], "n_components[0] must be an integer >= 1; got 0"),
        ([1, 2.0], "n_components[1] must be an integer >= 1; got 2.0"),
        ([1, "2"], "n_components[1] must be an integer >= 1; got '2'"),
        ([1, True], "n_components[1] must be an integer >= 1; got True"),
        (
            list(range(1, 1002)),
            "k lists 1001 values; a sweep fits at most MIXREG_MAX_K_SWEEP values "
            "(never more than 1000)",
        ),
        (0, "Input should be greater than or equal to 1"),
        (2.0, "Input should be an integer or a list of integers"),
        ("2", "Input should be an integer or a list of integers"),
        ({"k": 2}, "Input should be an integer or a list of integers"),
    ],
)
def test_bad_k_is_rejected_naming_the_problem(k, message):
    with pytest.raises(ValidationError) as error:
        fit_request.validate_python({"dataset_id": "d", "k": k})
    [problem] = error.value.errors()
    assert problem["loc"] == ("auto", "k")
    assert problem["msg"] == message


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
    assert "size-aware" in schemas["AutoParams"]["properties"]["n_init"]["description"]
    assert schemas["AmParams"]["properties"]["step_size"]["default"] == "auto"
    body = spec["paths"]["/fit"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    variants = {ref["$ref"].rsplit("/", 1)[1] for ref in body["oneOf"]}
    assert variants == {
        "AutoFit",
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
