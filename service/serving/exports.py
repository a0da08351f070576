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
from service.schemas import Baseline, FiniteFloat
from service.serving.prediction import StoredLines

OnnxType = Literal["float64", "float32"]
ONNX_MEDIA_TYPE = "application/octet-stream"
ONNX_INPUT = "X"
ONNX_OUTPUT = "predictions"
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
    document = estimator.to_dict(feature_names=list(model.feature_names))
    document["params"] = {**document["params"], **params}
    return document


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


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
    )
    version = None
    if registered_model is not None:
        version = registry.create_version(session, name=registered_model, model_id=model.id)
    return model, version


def _looks_like_id(value: str) -> bool:
    return len(value) == 32 and all(character in "0123456789abcdef" for character in value)


def onnx_model(lines: StoredLines, *, dtype: OnnxType) -> bytes:
    """An ONNX graph of the lines: input ``X`` ``[n, d]`` of ``dtype``, output
    ``predictions`` ``[n, k]`` of the same type (``X @ coef.T + intercept``)."""
    # Imported here: building the graph is the only use of onnx, and it is not on any hot path.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    element = {"float64": TensorProto.DOUBLE, "float32": TensorProto.FLOAT}[dtype]
    weights = numpy_helper.from_array(
        np.ascontiguousarray(lines.coef.T, dtype=dtype), name="coef_transposed"
    )
    intercept = numpy_helper.from_array(lines.intercept.astype(dtype), name="intercept")
    n_components, n_features = lines.coef.shape
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", [ONNX_INPUT, "coef_transposed"], ["products"]),
            helper.make_node("Add", ["products", "intercept"], [ONNX_OUTPUT]),
        ],
        "mixreg",
        [helper.make_tensor_value_info(ONNX_INPUT, element, ["n", n_features])],
        [helper.make_tensor_value_info(ONNX_OUTPUT, element, ["n", n_components])],
        initializer=[weights, intercept],
    )
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
