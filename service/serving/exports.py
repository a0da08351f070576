"""A model out of the service and back: its JSON document (lines, feature names, gate, metrics,
provenance; never pickle) and an ONNX graph that ONNX Runtime runs to the same predictions.

The document is ``MixtureOfLinearRegressions.to_dict``'s, with two members added: ``metrics``
(scores and the one-line baseline) and ``provenance`` (where and how the lines were fitted).
``MixtureOfLinearRegressions.from_dict`` reads it as it is; ``POST /models/import`` stores it.

A keyed model is a zip archive (docs/adr/0028-keyed-model-archives.md): the document as
``model.json``, with a ``keyed`` member (key column, key type, key count, the fit's summary),
and beside it one ``.npy`` array per member of every key's lines — ``keys`` (int64) or the
text keys as ``key_offsets`` (int64, n_keys + 1) and ``key_bytes`` (their UTF-8 bytes, one
after the other), ``coef`` (n_keys, k, d), ``intercept`` and ``shares`` (n_keys, k),
``min_loss``, ``n_rows`` and ``status`` (n_keys,). Keys are sorted; the document's own lines
are the global model's, for keys the model does not know. An import reads every array's
header before its data and never more bytes than the header (checked first) declares.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from collections.abc import Mapping
from typing import IO, Annotated, Any, Literal

import numpy as np
import orjson
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.orm import Session

from mixreg import MixtureOfLinearRegressions
from mixreg.service_support import STATUSES
from models_store import models as model_store
from models_store import registry
from models_store.common import new_id
from models_store.tables import Model, ModelVersion
from service import limits
from service.config import Settings
from service.errors import ConflictError, DataTooLargeError, InvalidInputError
from service.schemas import (
    MAX_TEXT_LENGTH,
    Baseline,
    Candidate,
    FiniteFloat,
    GateHoldout,
    KeyedSummary,
    Text,
)
from service.serving.formats import MAX_KEY_LENGTH
from service.serving.prediction import StoredLines

OnnxType = Literal["float64", "float32"]
ONNX_MEDIA_TYPE = "application/octet-stream"
ONNX_INPUT = "X"
ONNX_OUTPUT = "predictions"
ONNX_CONCOMITANT = "concomitant"
ONNX_PROBABILITIES = "probabilities"
ONNX_KEY = "key"
# LabelEncoder with keys_int64s / keys_strings: version 2 of the ONNX-ML domain.
ONNX_ML_OPSET = 2
MAX_ONNX_BYTES = 1024 * 1024 * 1024
"""The most bytes of lines one keyed model's graph may embed: an ONNX file is one protobuf
message, which cannot exceed 2 GB."""
# Opset 13 and IR version 7 are read by every ONNX Runtime of the last years.
ONNX_OPSET = 13
ONNX_IR_VERSION = 7


def export_document(
    model: Model,
    version: ModelVersion | None,
    keyed_arrays: Mapping[str, NDArray[Any]] | None = None,
) -> dict[str, Any]:
    """The self-describing JSON document of a stored model; of a keyed model (whose stored
    arrays, :func:`models_store.models.load_keyed_arrays`, are ``keyed_arrays``) also its ``keyed``
    member."""
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
    if model.split_by is not None:
        if keyed_arrays is None:
            raise ValueError(f"model {model.id} is keyed: its document needs its keys' arrays")
        keys = keyed_arrays["keys"]
        body["keyed"] = {
            "split_by": model.split_by,
            "key_type": "integer" if keys.dtype.kind in "iu" else "text",
            "n_keys": len(keys),
            "summary": model.keyed_summary,
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


DOCUMENT_MEMBER = "model.json"
ARCHIVE_MEDIA_TYPE = "application/zip"
IMPORTED_KEYS_PER_CHUNK = 65_536
"""Keys per stored chunk of an imported keyed model: the default ``keys_per_shard`` of a fit."""

# Each array of a keyed archive but the keys: its dtype and its shape after the key count.
_LINE_ARRAYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "coef": ("<f8", ("k", "d")),
    "intercept": ("<f8", ("k",)),
    "shares": ("<f8", ("k",)),
    "min_loss": ("<f8", ()),
    "n_rows": ("<i8", ()),
    "status": ("|i1", ()),
}
# What reading a damaged archive or member may raise.
_ARCHIVE_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    ValueError,
    OSError,
    EOFError,
    # An unknown compression method, an encrypted member.
    NotImplementedError,
    RuntimeError,
)


def archive_arrays(keyed_arrays: Mapping[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    """The ``.npy`` members of a keyed model's archive from its stored arrays: integer keys as
    they are, text keys as offsets into their UTF-8 bytes (as long as the keys, not the
    longest key times their count)."""
    keys = keyed_arrays["keys"]
    members: dict[str, NDArray[Any]] = {}
    if keys.dtype.kind in "iu":
        members["keys"] = keys.astype("<i8")
    else:
        encoded = [str(key).encode("utf-8") for key in keys.tolist()]
        offsets = np.zeros(len(encoded) + 1, dtype="<i8")
        np.cumsum([len(key) for key in encoded], out=offsets[1:])
        members["key_offsets"] = offsets
        members["key_bytes"] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    for name, (dtype, _) in _LINE_ARRAYS.items():
        members[name] = np.ascontiguousarray(keyed_arrays[name], dtype=dtype)
    return members


def write_archive(
    document: Mapping[str, Any], members: Mapping[str, NDArray[Any]], target: IO[bytes]
) -> None:
    """Write the zip archive of ``document`` (``model.json``) and the ``.npy`` ``members`` to
    ``target``, each array in blocks (never pickle)."""
    # Stored, not deflated: the lines are float64 that hardly compress, and an importer can
    # read a stored member's header without inflating anything.
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        archive.writestr(DOCUMENT_MEMBER, orjson.dumps(dict(document)))
        for name, array in members.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def read_archive_document(archive: zipfile.ZipFile, *, max_bytes: int) -> dict[str, Any]:
    """The ``model.json`` of a keyed model's archive (at most ``max_bytes``); 422 if it is
    missing, not a JSON object, or has no ``keyed`` member."""
    if DOCUMENT_MEMBER not in archive.namelist():
        raise InvalidInputError(
            f"the archive holds no {DOCUMENT_MEMBER}; import the .zip that GET "
            f"/models/{{id}}/export gives for a keyed model"
        )
    try:
        with archive.open(DOCUMENT_MEMBER) as member:
            # Never more than the limit, whatever size the archive declares.
            text = member.read(max_bytes + 1)
    except _ARCHIVE_ERRORS as exc:
        raise InvalidInputError(f"the archive's {DOCUMENT_MEMBER} cannot be read: {exc}") from None
    if len(text) > max_bytes:
        raise DataTooLargeError(
            f"the archive's {DOCUMENT_MEMBER} takes more than {max_bytes:,} bytes "
            f"(MIXREG_MAX_BODY_BYTES)"
        )
    document = parse_json_document(text, what=f"the archive's {DOCUMENT_MEMBER}")
    if not isinstance(document.get("keyed"), dict):
        raise InvalidInputError(
            f"keyed: the archive's {DOCUMENT_MEMBER} is not a keyed model's (no 'keyed' object); "
            f"a model without keys is imported as its JSON document"
        )
    return document


def parse_json_document(text: bytes, *, what: str = "the body") -> dict[str, Any]:
    """The JSON object ``text`` holds; 422 naming ``what`` if it holds anything else."""
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"{what} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidInputError(f"{what} must be a JSON object (a model document)")
    return document


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer, got {str(value)[:50]!r}")
    return value


def read_archive_arrays(
    archive: zipfile.ZipFile, document: Mapping[str, Any], *, max_decoded_bytes: int
) -> dict[str, NDArray[Any]]:
    """Every key's lines in the archive, checked against its document (whose ``n_components``
    and ``n_features`` are within the limits): keys (int64, or an object array of text)
    sorted and distinct, finite lines, known statuses. 422 naming the array and what is
    wrong; 413 when the arrays' headers declare more than ``max_decoded_bytes`` together."""
    keyed = document["keyed"]
    n_keys = _positive_int(keyed.get("n_keys"), "keyed.n_keys")
    key_type = keyed.get("key_type")
    if key_type not in ("integer", "text"):
        raise InvalidInputError("keyed.key_type must be 'integer' or 'text'")
    sizes = {
        "k": _positive_int(document.get("n_components"), "n_components"),
        "d": _positive_int(document.get("n_features"), "n_features"),
    }
    wanted = {"keys"} if key_type == "integer" else {"key_offsets", "key_bytes"}
    wanted |= set(_LINE_ARRAYS)
    held = {name.removesuffix(".npy") for name in archive.namelist() if name != DOCUMENT_MEMBER}
    if held != wanted:
        missing, extra = sorted(wanted - held), sorted(held - wanted)
        raise InvalidInputError(
            f"the archive of a model with {key_type} keys holds the arrays "
            f"{', '.join(sorted(wanted))}"
            + (f"; it lacks {', '.join(missing)}" if missing else "")
            + (f"; it also holds {', '.join(extra)[:200]}" if extra else "")
        )
    reader = _MemberReader(archive, max_decoded_bytes=max_decoded_bytes)
    arrays: dict[str, NDArray[Any]] = {}
    if key_type == "integer":
        keys: NDArray[Any] = reader.read("keys", "<i8", (n_keys,))
        if (np.diff(keys) <= 0).any():
            raise InvalidInputError("keys must be sorted and distinct (increasing)")
    else:
        keys = _text_keys(reader, n_keys)
    arrays["keys"] = keys
    for name, (dtype, dimensions) in _LINE_ARRAYS.items():
        arrays[name] = reader.read(
            name, dtype, (n_keys, *(sizes[dimension] for dimension in dimensions))
        )
    for name in ("coef", "intercept", "shares"):
        if not np.isfinite(arrays[name]).all():
            raise InvalidInputError(f"{name} must hold finite numbers")
    if np.isinf(arrays["min_loss"]).any():
        raise InvalidInputError("min_loss must hold finite numbers (NaN for keys without lines)")
    if (arrays["n_rows"] < 0).any():
        raise InvalidInputError("n_rows must hold counts (0 or more)")
    status = arrays["status"]
    if ((status < 0) | (status >= len(STATUSES))).any():
        raise InvalidInputError(
            f"status must hold indices into ({', '.join(STATUSES)}): 0 to {len(STATUSES) - 1}"
        )
    return arrays


def _text_keys(reader: _MemberReader, n_keys: int) -> NDArray[Any]:
    """The text keys of ``key_offsets`` and ``key_bytes``: each 1 to ``MAX_KEY_LENGTH``
    characters of UTF-8 without NUL, sorted and distinct."""
    offsets = reader.read("key_offsets", "<i8", (n_keys + 1,))
    lengths = np.diff(offsets)
    # A UTF-8 character takes at most 4 bytes.
    if offsets[0] != 0 or (lengths < 1).any() or (lengths > 4 * MAX_KEY_LENGTH).any():
        raise InvalidInputError(
            f"key_offsets must start at 0 and step by 1 to {4 * MAX_KEY_LENGTH} bytes (a key "
            f"of 1 to {MAX_KEY_LENGTH} characters)"
        )
    data = reader.read("key_bytes", "|u1", (int(offsets[-1]),)).tobytes()
    keys: list[str] = []
    for index, (start, end) in enumerate(
        zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
    ):
        try:
            key = data[start:end].decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(f"key {index} is not UTF-8 text") from None
        if len(key) > MAX_KEY_LENGTH or "\x00" in key:
            raise InvalidInputError(
                f"key {index} must be a text of 1 to {MAX_KEY_LENGTH} characters without NUL"
            )
        if keys and key <= keys[-1]:
            raise InvalidInputError(
                f"keys must be sorted and distinct (increasing): key {index} is not above "
                f"key {index - 1}"
            )
        keys.append(key)
    return np.array(keys, dtype=object)


class _MemberReader:
    """Reads the ``.npy`` members of an archive: the header first, checked against the dtype
    and shape wanted and against what the archive may decode to in all, then exactly the
    bytes that shape needs (a member cannot inflate to more)."""

    def __init__(self, archive: zipfile.ZipFile, *, max_decoded_bytes: int) -> None:
        self._archive = archive
        self._budget = max_decoded_bytes
        self._limit = max_decoded_bytes

    def read(self, name: str, dtype: str, shape: tuple[int, ...]) -> NDArray[Any]:
        wanted = np.dtype(dtype)
        try:
            with self._archive.open(f"{name}.npy") as member:
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    header = np.lib.format.read_array_header_1_0(member)
                elif version == (2, 0):
                    header = np.lib.format.read_array_header_2_0(member)
                else:
                    raise ValueError(f".npy version {version} is not read")
                stored_shape, fortran_order, stored_dtype = header
                if tuple(stored_shape) != shape or stored_dtype != wanted or fortran_order:
                    raise InvalidInputError(
                        f"{name} must be a C-order array of {wanted} of shape {shape}, got "
                        f"{stored_dtype} of shape {tuple(stored_shape)}"
                    )
                n_bytes = math.prod(shape) * wanted.itemsize
                if n_bytes > self._budget:
                    raise DataTooLargeError(
                        f"the archive's arrays decode to more than {self._limit:,} bytes "
                        f"(MIXREG_MAX_DECODED_BYTES); {name} alone takes {n_bytes:,}"
                    )
                self._budget -= n_bytes
                data = member.read(n_bytes)
        except _ARCHIVE_ERRORS as exc:
            raise InvalidInputError(f"{name} is not a readable .npy array: {exc}") from None
        if len(data) != n_bytes:
            raise InvalidInputError(
                f"{name} declares {n_bytes:,} bytes but holds only {len(data):,}"
            )
        return np.frombuffer(data, dtype=wanted).reshape(shape)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GateFitMetrics(_Lenient):
    """How a gated model's gate was fitted and scored (``metrics.gate``)."""

    n_iter: int | None = Field(default=None, ge=0)
    converged: bool | None = None
    holdout: GateHoldout | None = None


MAX_WARNINGS = 100
"""Warnings an imported document may hold (a fit of a k sweep of 20 has a few per k)."""
MAX_WARNING_LENGTH = 2000
"""Characters of one imported warning (a fit's warning is a sentence or two)."""
WarningText = Annotated[str, Field(max_length=MAX_WARNING_LENGTH)]


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
    warnings: list[WarningText] = Field(default_factory=list, max_length=MAX_WARNINGS)
    gate: GateFitMetrics | None = None


class ImportedProvenance(_Lenient):
    """The ``provenance`` member of an imported document (every member optional). Its
    ``dataset_id`` is not read: an imported model never names a dataset of this service."""

    model_id: Text | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    fit_seconds: FiniteFloat = Field(default=0.0, ge=0)
    n_iter: int = Field(default=0, ge=0)
    loss_history: list[FiniteFloat] = Field(default_factory=list)
    candidates: list[Candidate] | None = None


ParamValue = (
    Annotated[str, Field(max_length=MAX_TEXT_LENGTH)]
    | FiniteFloat
    | int
    | bool
    | None
    | list[FiniteFloat | int]
)


class ImportedNames(_Lenient):
    """The names of an imported document, bounded as a dataset's and a fit's are."""

    feature_names: list[Text]
    params: dict[Text, ParamValue] = Field(default_factory=dict, max_length=64)


class ImportedGateNames(_Lenient):
    """The dataset columns an imported gate reads, named as a dataset's columns are."""

    concomitant: list[Text]


class ImportedKeyed(_Lenient):
    """The ``keyed`` member of an imported keyed model's document."""

    split_by: Text
    summary: KeyedSummary | None = None


def _section(model: type[BaseModel], value: Any, name: str) -> Any:
    try:
        return model.model_validate(value if value is not None else {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in (name, *first["loc"]) if part != "")
        raise InvalidInputError(f"{where}: {first['msg']}") from None


def check_document_limits(document: Mapping[str, Any], settings: Settings) -> None:
    """422 naming ``n_components`` or ``n_features`` when a document has more lines or
    features than a fit may (``MIXREG_MAX_K``, ``MIXREG_MAX_FEATURES``)."""
    k = _positive_int(document.get("n_components"), "n_components")
    d = _positive_int(document.get("n_features"), "n_features")
    limits.check_imported_shape(k, d, settings=settings)


def import_document(
    session: Session,
    document: Any,
    *,
    registered_model: str | None,
    settings: Settings,
    keyed_arrays: Mapping[str, NDArray[Any]] | None = None,
) -> tuple[Model, ModelVersion | None]:
    """Store the model of an exported document (as the next version of ``registered_model``
    if given), with every key's lines (``keyed_arrays``, :func:`read_archive_arrays`) for a
    keyed model; 422 naming what the document lacks or holds wrong, or what is beyond the
    limits of a fit."""
    if not isinstance(document, Mapping):
        raise InvalidInputError("a model document is a JSON object")
    check_document_limits(document, settings)
    keyed = None
    if document.get("keyed") is not None:
        if keyed_arrays is None:
            raise InvalidInputError(
                "keyed: this is a keyed model's document, whose keys' lines travel beside it: "
                f"import the .zip archive GET /models/{{id}}/export gives (Content-Type: "
                f"{ARCHIVE_MEDIA_TYPE})"
            )
        keyed = _section(ImportedKeyed, document["keyed"], "keyed")
        document = {name: value for name, value in document.items() if name != "keyed"}
    try:
        estimator = MixtureOfLinearRegressions.from_dict(document)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    if "metrics" not in document:
        raise InvalidInputError(
            "the model document has no 'metrics'; import a document of GET /models/{id}/export"
        )
    names = _section(ImportedNames, document, "")
    _check_distinct(names.feature_names, "feature_names")
    gate = document.get("gate")
    if gate is not None and gate.get("concomitant") is not None:
        concomitant = _section(ImportedGateNames, gate, "gate")
        _check_distinct(concomitant.concomitant, "gate.concomitant")
    metrics = _section(ImportedMetrics, document["metrics"], "metrics")
    provenance = _section(ImportedProvenance, document.get("provenance"), "provenance")
    params = dict(names.params)
    params.pop("random_state", None)
    model = model_store.create_model(
        session,
        model_store.ModelRecord(
            job_id=None,
            # Fitted elsewhere, or here on data that may have changed or gone: the document's
            # dataset is never joined to this service's datasets (a picture of other rows).
            dataset_id=new_id(),
            name=None,
            algorithm=str(estimator.algorithm),
            n_components=int(estimator.coef_.shape[0]),
            n_features=int(estimator.coef_.shape[1]),
            feature_names=names.feature_names,
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
            candidates=None
            if provenance.candidates is None
            else [candidate.model_dump() for candidate in provenance.candidates],
            warnings=metrics.warnings,
            gate=None
            if gate is None
            else {
                **estimator.to_dict(concomitant_names=gate["concomitant"])["gate"],
                **(metrics.gate or GateFitMetrics()).model_dump(),
            },
            split_by=None if keyed is None else keyed.split_by,
            keyed_summary=None
            if keyed is None or keyed.summary is None
            else keyed.summary.model_dump(),
        ),
    )
    if keyed is not None:
        assert keyed_arrays is not None
        model_store.add_keyed_model_chunks(
            session, model_id=model.id, arrays=keyed_arrays, keys_per_chunk=IMPORTED_KEYS_PER_CHUNK
        )
    version = None
    if registered_model is not None:
        version = registry.create_version(session, name=registered_model, model_id=model.id)
    return model, version


def import_archive(
    session: Session, body: bytes, *, registered_model: str | None, settings: Settings
) -> tuple[Model, ModelVersion | None]:
    """Store the keyed model of an archive of ``GET /models/{id}/export``: its document is
    checked (and held within the limits of a fit) before its arrays are read."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
    except _ARCHIVE_ERRORS as exc:
        raise InvalidInputError(f"the body is not a readable zip archive: {exc}") from None
    with archive:
        document = read_archive_document(archive, max_bytes=settings.max_body_bytes)
        check_document_limits(document, settings)
        arrays = read_archive_arrays(
            archive, document, max_decoded_bytes=settings.max_decoded_bytes
        )
    return import_document(
        session,
        document,
        registered_model=registered_model,
        settings=settings,
        keyed_arrays=arrays,
    )


def _check_distinct(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for index, name in enumerate(names):
        if not name:
            raise InvalidInputError(f"{what}[{index}] is empty")
        if name in seen:
            raise InvalidInputError(f"{what}[{index}] repeats the name '{name}'")
        seen.add(name)


def onnx_model(lines: StoredLines, *, dtype: OnnxType) -> bytes:
    """An ONNX graph of the lines: input ``X`` ``[n, d]`` of ``dtype``, output
    ``predictions`` ``[n, k]`` of the same type (``X @ coef.T + intercept``); for a gated
    model also the output ``probabilities`` ``[n, k]`` (the softmax of the gate's logits, of
    ``X`` or of a second input ``concomitant`` ``[n, q]`` when the gate reads dataset
    columns).

    A ``float32`` graph takes and gives float32 but computes in float64 between two casts:
    the lines' terms on features far from zero (years near 2000) nearly cancel their
    intercepts, and summed in float32 they lose digits (1.4e-5 absolute on years); in float64
    each prediction is the float32 rounding of mixreg's prediction of the same rows."""
    # Imported here: building the graph is the only use of onnx, and it is not on any hot path.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    element = {"float64": TensorProto.DOUBLE, "float32": TensorProto.FLOAT}[dtype]
    # The names the float64 arithmetic reads and writes; float32 casts in and out of them.
    casts: list[Any] = []
    x_input, predictions, concomitant, probabilities = (
        ONNX_INPUT,
        ONNX_OUTPUT,
        ONNX_CONCOMITANT,
        ONNX_PROBABILITIES,
    )
    if dtype == "float32":
        x_input, predictions = "X_double", "predictions_double"
        concomitant, probabilities = "concomitant_double", "probabilities_double"
        casts.append(helper.make_node("Cast", [ONNX_INPUT], [x_input], to=TensorProto.DOUBLE))
    weights = numpy_helper.from_array(
        np.ascontiguousarray(lines.coef.T, dtype=np.float64), name="coef_transposed"
    )
    intercept = numpy_helper.from_array(lines.intercept.astype(np.float64), name="intercept")
    n_components, n_features = lines.coef.shape
    nodes = [
        *casts,
        helper.make_node("MatMul", [x_input, "coef_transposed"], ["products"]),
        helper.make_node("Add", ["products", "intercept"], [predictions]),
    ]
    inputs = [helper.make_tensor_value_info(ONNX_INPUT, element, ["n", n_features])]
    outputs = [helper.make_tensor_value_info(ONNX_OUTPUT, element, ["n", n_components])]
    initializer = [weights, intercept]
    if lines.gate is not None:
        gate_input = x_input
        if lines.gate.concomitant is not None:
            gate_input = concomitant
            inputs.append(
                helper.make_tensor_value_info(
                    ONNX_CONCOMITANT, element, ["n", len(lines.gate.concomitant)]
                )
            )
            if dtype == "float32":
                nodes.append(
                    helper.make_node(
                        "Cast", [ONNX_CONCOMITANT], [concomitant], to=TensorProto.DOUBLE
                    )
                )
        initializer += [
            numpy_helper.from_array(
                np.ascontiguousarray(lines.gate.coef.T, dtype=np.float64),
                name="gate_coef_transposed",
            ),
            numpy_helper.from_array(lines.gate.intercept.astype(np.float64), name="gate_intercept"),
        ]
        nodes += [
            helper.make_node("MatMul", [gate_input, "gate_coef_transposed"], ["gate_products"]),
            helper.make_node("Add", ["gate_products", "gate_intercept"], ["gate_logits"]),
            helper.make_node("Softmax", ["gate_logits"], [probabilities], axis=1),
        ]
        outputs.append(
            helper.make_tensor_value_info(ONNX_PROBABILITIES, element, ["n", n_components])
        )
        if dtype == "float32":
            nodes.append(
                helper.make_node("Cast", [probabilities], [ONNX_PROBABILITIES], to=element)
            )
    if dtype == "float32":
        nodes.append(helper.make_node("Cast", [predictions], [ONNX_OUTPUT], to=element))
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


def onnx_keyed_model(lines: StoredLines, *, dtype: OnnxType) -> bytes:
    """An ONNX graph of a keyed model: inputs ``X`` ``[n, d]`` of ``dtype`` and ``key``
    ``[n]`` (int64 or string, as the model's keys), output ``predictions`` ``[n, k]``: each
    row by its key's lines, a key without lines (unknown, skipped or failed) by the global
    model's, as ``unknown_keys: global`` predicts. A ``LabelEncoder`` (ONNX-ML) maps a key to
    its position, a ``Gather`` takes that position's lines. 409 when the lines (float64, as
    in every graph: a ``float32`` graph casts ``X`` in and the predictions out, see
    :func:`onnx_model`) exceed what one ONNX file can hold."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    keyed = lines.keyed
    assert keyed is not None
    element = {"float64": TensorProto.DOUBLE, "float32": TensorProto.FLOAT}[dtype]
    n_keys, n_components, n_features = keyed.coef.shape
    size = (n_keys + 1) * n_components * (n_features + 1) * np.dtype(np.float64).itemsize
    if size > MAX_ONNX_BYTES:
        raise ConflictError(
            f"model {lines.model_id} has {n_keys:,} keys whose lines take {size:,} bytes: more "
            f"than one ONNX graph holds ({MAX_ONNX_BYTES:,}); export it with "
            f"GET /models/{lines.model_id}/export (a .zip of every key's lines)"
        )
    # The global model is the last position, the one every key without lines maps to.
    coef = np.concatenate([keyed.coef, lines.coef[None]]).astype(np.float64)
    intercept = np.concatenate([keyed.intercept, lines.intercept[None]]).astype(np.float64)
    x_input, predictions = ONNX_INPUT, ONNX_OUTPUT
    casts: list[Any] = []
    if dtype == "float32":
        x_input, predictions = "X_double", "predictions_double"
        casts.append(helper.make_node("Cast", [ONNX_INPUT], [x_input], to=TensorProto.DOUBLE))
    with_lines = np.flatnonzero(keyed.status <= STATUSES.index("k1"))
    integer_keys = keyed.keys.dtype.kind in "iu"
    key_values = keyed.keys[with_lines].tolist()
    encoder = helper.make_node(
        "LabelEncoder",
        [ONNX_KEY],
        ["key_position"],
        domain="ai.onnx.ml",
        values_int64s=with_lines.tolist(),
        default_int64=n_keys,
        **(
            {"keys_int64s": [int(key) for key in key_values]}
            if integer_keys
            else {"keys_strings": [str(key) for key in key_values]}
        ),
    )
    nodes = [
        encoder,
        *casts,
        helper.make_node("Gather", ["coef", "key_position"], ["row_coef"], axis=0),
        helper.make_node("Unsqueeze", [x_input, "last_axis"], ["X_column"]),
        # (n, k, d) @ (n, d, 1): each row's k predictions.
        helper.make_node("MatMul", ["row_coef", "X_column"], ["products_column"]),
        helper.make_node("Squeeze", ["products_column", "last_axis"], ["products"]),
        helper.make_node("Gather", ["intercept", "key_position"], ["row_intercept"], axis=0),
        helper.make_node("Add", ["products", "row_intercept"], [predictions]),
    ]
    if dtype == "float32":
        nodes.append(helper.make_node("Cast", [predictions], [ONNX_OUTPUT], to=element))
    inputs = [
        helper.make_tensor_value_info(ONNX_INPUT, element, ["n", n_features]),
        helper.make_tensor_value_info(
            ONNX_KEY, TensorProto.INT64 if integer_keys else TensorProto.STRING, ["n"]
        ),
    ]
    outputs = [helper.make_tensor_value_info(ONNX_OUTPUT, element, ["n", n_components])]
    initializer = [
        numpy_helper.from_array(np.ascontiguousarray(coef), name="coef"),
        numpy_helper.from_array(np.ascontiguousarray(intercept), name="intercept"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), name="last_axis"),
    ]
    graph = helper.make_graph(nodes, "mixreg-keyed", inputs, outputs, initializer=initializer)
    model = helper.make_model(
        graph,
        producer_name="mixreg",
        opset_imports=[
            helper.make_opsetid("", ONNX_OPSET),
            helper.make_opsetid("ai.onnx.ml", ONNX_ML_OPSET),
        ],
        ir_version=ONNX_IR_VERSION,
        doc_string=f"a mixture of {n_components} linear regressions per {lines.split_by}, "
        f"model {lines.model_id}: one prediction per line of the row's key for each row of X "
        f"(the global model's for a key without lines)",
    )
    onnx.checker.check_model(model)
    buffer = io.BytesIO()
    onnx.save_model(model, buffer)
    return buffer.getvalue()
