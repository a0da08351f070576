"""A model out of the service and back: its JSON document (lines, feature names, gate, metrics,
provenance; never pickle) and an ONNX graph that ONNX Runtime runs to the same predictions.

The document is ``MixtureOfLinearRegressions.to_dict``'s, with two members added: ``metrics``
(scores and the one-line baseline) and ``provenance`` (where and how the lines were fitted).
``MixtureOfLinearRegressions.from_dict`` reads it as it is; ``POST /models/import`` stores it.
"""

from __future__ import annotations

import io
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.orm import Session

from mixreg import MixtureOfLinearRegressions
from models_store import registry, repository
from models_store.tables import Model, ModelVersion
from service.errors import InvalidInputError
from service.schemas import Baseline, FiniteFloat, GateHoldout
from service.serving.prediction import StoredLines

OnnxType = Literal["float64", "float32"]
ONNX_MEDIA_TYPE = "application/octet-stream"
ONNX_INPUT = "X"
ONNX_OUTPUT = "predictions"
ONNX_CONCOMITANT = "concomitant"
ONNX_PROBABILITIES = "probabilities"
# Opset 13 and IR version 7 are read by every ONNX Runtime of the last years.
ONNX_OPSET = 13
ONNX_IR_VERSION = 7


def export_document(model: Model, version: ModelVersion | None) -> dict[str, Any]:
    """The self-describing JSON document of a stored model."""
    lines = StoredLines.of_model(model)
    estimator_params = {
        name: value for name, value in dict(model.params).items() if name != "time_budget"
    }
    body = _lines_document(model, lines, estimator_params)
    body["metrics"] = {
        "train_min_loss": model.train_min_loss,
        "holdout_min_loss": model.holdout_min_loss,
        "baseline": dict(model.baseline),
        "n_train": model.n_train,
        "n_holdout": model.n_holdout,
        "converged": model.converged,
        "log_likelihood": model.log_likelihood,
        "bic": model.bic,
        "n_parameters": model.n_parameters,
        "warnings": list(model.warnings),
    }
    if model.gate is not None:
        body["metrics"]["gate"] = {
            name: model.gate.get(name) for name in ("n_iter", "converged", "holdout")
        }
    body["provenance"] = {
        "model_id": model.id,
        "registered_model": None if version is None else version.registered_model,
        "version": None if version is None else version.version,
        "dataset_id": model.dataset_id,
        "job_id": model.job_id,
        "seed": model.seed,
        "created_at": model.created_at.isoformat(),
        "fit_seconds": model.fit_seconds,
        "n_iter": model.n_iter,
        "loss_history": list(model.loss_history),
        "candidates": model.candidates,
    }
    return body


def _lines_document(model: Model, lines: StoredLines, params: dict[str, Any]) -> dict[str, Any]:
    estimator = MixtureOfLinearRegressions(
        n_components=model.n_components,
        algorithm=model.algorithm,
        fit_intercept=model.fit_intercept,
        random_state=model.seed,
    )
    estimator.coef_ = lines.coef
    estimator.intercept_ = lines.intercept
    estimator.shares_ = np.asarray(model.shares, dtype=np.float64)
    estimator.n_features_in_ = model.n_features
    concomitant = None
    if model.gate is not None:
        gate = model.gate
        estimator.gate_coef_ = np.asarray(gate["coef"], dtype=np.float64)
        estimator.gate_intercept_ = np.asarray(gate["intercept"], dtype=np.float64)
        estimator.noise_variance_ = np.asarray(gate["noise_variance"], dtype=np.float64)
        estimator.log_likelihood_ = float(gate["log_likelihood"])
        estimator.bic_ = float(gate["bic"])
        concomitant = gate["concomitant"]
        estimator.gate_on_features_ = concomitant is None
        estimator.n_concomitant_in_ = estimator.gate_coef_.shape[1]
    document = estimator.to_dict(
        feature_names=list(model.feature_names), concomitant_names=concomitant
    )
    document["params"] = {**document["params"], **params}
    return document


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GateFitMetrics(_Lenient):
    """How a gated model's gate was fitted and scored (``metrics.gate``)."""

    n_iter: int | None = Field(default=None, ge=0)
    converged: bool | None = None
    holdout: GateHoldout | None = None


class ImportedMetrics(_Lenient):
    """The ``metrics`` member of an imported document."""

    train_min_loss: FiniteFloat = Field(ge=0)
    holdout_min_loss: FiniteFloat | None = Field(default=None, ge=0)
    baseline: Baseline
    n_train: int = Field(ge=1)
    n_holdout: int = Field(default=0, ge=0)
    converged: bool | None = None
    log_likelihood: FiniteFloat | None = None
    bic: FiniteFloat | None = None
    n_parameters: int | None = Field(default=None, ge=1)
    warnings: list[str] = Field(default_factory=list)
    gate: GateFitMetrics | None = None


class ImportedProvenance(_Lenient):
    """The ``provenance`` member of an imported document (every member optional)."""

    model_id: str | None = None
    dataset_id: str | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    fit_seconds: FiniteFloat = Field(default=0.0, ge=0)
    n_iter: int = Field(default=0, ge=0)
    loss_history: list[FiniteFloat] = Field(default_factory=list)
    candidates: list[dict[str, Any]] | None = None


def _section(model: type[_Lenient], value: Any, name: str) -> Any:
    try:
        return model.model_validate(value if value is not None else {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in (name, *first["loc"]))
        raise InvalidInputError(f"{where}: {first['msg']}") from None


def import_document(
    session: Session, document: Any, *, registered_model: str | None
) -> tuple[Model, ModelVersion | None]:
    """Store the model of an exported document (as the next version of ``registered_model``
    if given); 422 naming what the document lacks or holds wrong."""
    try:
        estimator = MixtureOfLinearRegressions.from_dict(document)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    if "metrics" not in document:
        raise InvalidInputError(
            "the model document has no 'metrics'; import a document of GET /models/{id}/export"
        )
    metrics = _section(ImportedMetrics, document["metrics"], "metrics")
    provenance = _section(ImportedProvenance, document.get("provenance"), "provenance")
    dataset_id = provenance.dataset_id
    if dataset_id is None or not _looks_like_id(dataset_id):
        # Fitted elsewhere on data this service never held: an id that names no dataset here.
        dataset_id = repository.new_id()
    params = dict(document.get("params") or {})
    params.pop("random_state", None)
    model = repository.create_model(
        session,
        job_id=None,
        dataset_id=dataset_id,
        name=None,
        algorithm=str(estimator.algorithm),
        n_components=int(estimator.coef_.shape[0]),
        n_features=int(estimator.coef_.shape[1]),
        feature_names=list(document["feature_names"]),
        fit_intercept=bool(estimator.fit_intercept),
        params=params,
        seed=provenance.seed,
        coef=estimator.coef_,
        intercept=estimator.intercept_,
        shares=estimator.shares_,
        train_min_loss=metrics.train_min_loss,
        holdout_min_loss=metrics.holdout_min_loss,
        baseline=metrics.baseline.model_dump(),
        n_train=metrics.n_train,
        n_holdout=metrics.n_holdout,
        loss_history=provenance.loss_history,
        n_iter=provenance.n_iter,
        fit_seconds=provenance.fit_seconds,
        converged=metrics.converged,
        log_likelihood=metrics.log_likelihood,
        bic=metrics.bic,
        n_parameters=metrics.n_parameters,
        candidates=provenance.candidates,
        warnings=metrics.warnings,
        gate=None
        if document.get("gate") is None
        else {
            **estimator.to_dict(concomitant_names=document["gate"]["concomitant"])["gate"],
            **(metrics.gate or GateFitMetrics()).model_dump(),
        },
    )
    version = None
    if registered_model is not None:
        version = registry.create_version(session, name=registered_model, model_id=model.id)
    return model, version


def _looks_like_id(value: str) -> bool:
    return len(value) == 32 and all(character in "0123456789abcdef" for character in value)


def onnx_model(lines: StoredLines, *, dtype: OnnxType) -> bytes:
    """An ONNX graph of the lines: input ``X`` ``[n, d]`` of ``dtype``, output
    ``predictions`` ``[n, k]`` of the same type (``X @ coef.T + intercept``); for a gated
    model also the output ``probabilities`` ``[n, k]`` (the softmax of the gate's logits, of
    ``X`` or of a second input ``concomitant`` ``[n, q]`` when the gate reads dataset
    columns)."""
    # Imported here: building the graph is the only use of onnx, and it is not on any hot path.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    element = {"float64": TensorProto.DOUBLE, "float32": TensorProto.FLOAT}[dtype]
    weights = numpy_helper.from_array(
        np.ascontiguousarray(lines.coef.T, dtype=dtype), name="coef_transposed"
    )
    intercept = numpy_helper.from_array(lines.intercept.astype(dtype), name="intercept")
    n_components, n_features = lines.coef.shape
    nodes = [
        helper.make_node("MatMul", [ONNX_INPUT, "coef_transposed"], ["products"]),
        helper.make_node("Add", ["products", "intercept"], [ONNX_OUTPUT]),
    ]
    inputs = [helper.make_tensor_value_info(ONNX_INPUT, element, ["n", n_features])]
    outputs = [helper.make_tensor_value_info(ONNX_OUTPUT, element, ["n", n_components])]
    initializer = [weights, intercept]
    if lines.gate is not None:
        gate_input = ONNX_INPUT
        if lines.gate.concomitant is not None:
            gate_input = ONNX_CONCOMITANT
            inputs.append(
                helper.make_tensor_value_info(
                    ONNX_CONCOMITANT, element, ["n", len(lines.gate.concomitant)]
                )
            )
        initializer += [
            numpy_helper.from_array(
                np.ascontiguousarray(lines.gate.coef.T, dtype=dtype), name="gate_coef_transposed"
            ),
            numpy_helper.from_array(lines.gate.intercept.astype(dtype), name="gate_intercept"),
        ]
        nodes += [
            helper.make_node("MatMul", [gate_input, "gate_coef_transposed"], ["gate_products"]),
            helper.make_node("Add", ["gate_products", "gate_intercept"], ["gate_logits"]),
            helper.make_node("Softmax", ["gate_logits"], [ONNX_PROBABILITIES], axis=1),
        ]
        outputs.append(
            helper.make_tensor_value_info(ONNX_PROBABILITIES, element, ["n", n_components])
        )
    graph = helper.make_graph(nodes, "mixreg", inputs, outputs, initializer=initializer)
    model = helper.make_model(
        graph,
        producer_name="mixreg",
        opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
        ir_version=ONNX_IR_VERSION,
        doc_string=f"mixture of {n_components} linear regressions, model {lines.model_id}: "
        f"one prediction per line for each row of X",
    )
    onnx.checker.check_model(model)
    buffer = io.BytesIO()
    onnx.save_model(model, buffer)
    return buffer.getvalue()
