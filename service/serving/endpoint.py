"""The predict endpoints' work: read the body (JSON, ``.npy`` or ``.npz``), find the model,
answer in the format the client accepts.

This is the service's hot path. A single-row prediction is a (1, d) by (d, k) product: it is
computed on the event loop, and a cached model needs no database access, so a request never
waits for a thread. Bodies larger than ``INLINE_BODY_BYTES`` are parsed in the thread pool, and
answers of more than ``INLINE_ANSWER_VALUES`` numbers (rows times k) are computed and serialized
there, so neither a 100,000-row batch nor a small body asking a k = 100 model about many rows
holds up the other requests; a model that is not cached yet is loaded there too. The response
is serialized once, straight to bytes.

A JSON body takes at most ``MIXREG_MAX_PREDICT_JSON_BYTES``: its parse holds the GIL, thread
or not. A binary body names its model outside the body, so its header is checked against the
limits, the size of the answer among them, before its data are converted, and an ``.npz`` is
decompressed only up to what its headers declare.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from numpy.typing import NDArray
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import Request
from starlette.responses import Response

from service import limits
from service.checks import IngestError
from service.config import Settings
from service.data.ingest import DatasetTooLargeError
from service.data.model_references import is_reference_like
from service.errors import (
    DataTooLargeError,
    InvalidInputError,
    NotAcceptableError,
    ServiceError,
    UnsupportedMediaTypeError,
)
from service.logs import request_id_var
from service.schemas import ModelPredictRequest, PredictRequest
from service.serving import formats
from service.serving.prediction import (
    Concomitant,
    FloatArray,
    ModelCache,
    StoredLines,
    gate_columns,
    load_referenced_lines,
    predict_gated,
    predict_rows,
    score_predictions,
)
from service.serving.references import ReferenceResolver, version_label

INLINE_BODY_BYTES = 64 * 1024
"""Bodies up to this size are parsed on the event loop; larger ones in the thread pool."""

INLINE_ANSWER_VALUES = 8 * 1024
"""Answers of up to this many predicted values (rows times k) are computed and serialized on the
event loop; larger ones in the thread pool (a small body can ask for a big answer)."""


@dataclass(frozen=True)
class PredictInput:
    """What a predict request asks: rows ``X``, optional targets ``y``, the model's id, and
    for a keyed model each row's key and what an unknown key gets."""

    model_id: str | None
    X: FloatArray
    y: FloatArray | None
    groups: list[str | int | float] | None = None
    concomitant: Concomitant | None = None
    keys: list[str | int] | None = None
    unknown_keys: str = "global"


# A reference in the body is checked by the schema's ``Text`` rule beyond this length.
MAX_REFERENCE_LENGTH = 256


def _number_matrix(value: object) -> FloatArray | None:
    """``value`` as a finite float64 matrix if it is a non-empty list of equally long,
    non-empty lists of numbers; else None."""
    if type(value) is not list or not value:
        return None
    try:
        array = np.array(value)
    except (ValueError, TypeError, OverflowError):  # ragged, or not numbers
        return None
    # Booleans mixed with numbers become numbers here, as the schema reads them too; anything
    # else (strings, nulls, integers beyond int64) leaves another dtype.
    if array.ndim != 2 or array.shape[1] == 0 or array.dtype.kind not in "fi":
        return None
    matrix = array.astype(np.float64, copy=False)
    return matrix if np.isfinite(matrix).all() else None


def _number_vector(value: object, length: int) -> FloatArray | None:
    """``value`` as a finite float64 vector of ``length`` numbers; else None."""
    if type(value) is not list or len(value) != length:
        return None
    try:
        array = np.array(value)
    except (ValueError, TypeError, OverflowError):
        return None
    if array.ndim != 1 or array.dtype.kind not in "fi":
        return None
    vector = array.astype(np.float64, copy=False)
    return vector if np.isfinite(vector).all() else None


def _read_plain_json(body: bytes, *, named_in_body: bool) -> PredictInput | None:
    """The common request — a model id and rows of finite numbers — parsed straight to arrays;
    None for anything else, which the schema then reads (and explains what is wrong).

    Every request this accepts, the schema accepts with the same values; it is only faster
    (about five times on a 100,000-row batch).
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(data) is not dict or "X" not in data:
        return None
    if not data.keys() <= ({"model_id", "X", "y"} if named_in_body else {"X", "y"}) | KEYED:
        return None
    model_id = data.get("model_id")
    if named_in_body and not (
        type(model_id) is str
        and len(model_id) <= MAX_REFERENCE_LENGTH
        and is_reference_like(model_id)
    ):
        return None
    X = _number_matrix(data["X"])
    if X is None:
        return None
    y = None
    if data.get("y") is not None:
        y = _number_vector(data["y"], len(X))
        if y is None:
            return None
    keys = data.get("keys")
    unknown_keys = data.get("unknown_keys", "global")
    if keys is not None and not _plain_keys(keys, len(X)):
        return None
    if unknown_keys not in ("global", "error"):
        return None
    return PredictInput(model_id=model_id, X=X, y=y, keys=keys, unknown_keys=unknown_keys)


KEYED = {"keys", "unknown_keys"}
"""The fields of a keyed prediction."""


def _plain_keys(keys: object, length: int) -> bool:
    """Whether ``keys`` is a list of ``length`` short strings or 64-bit integers (not booleans);
    anything else the schema reads and explains."""
    return (
        type(keys) is list
        and len(keys) == length
        and all(
            (type(key) is str and 0 < len(key) <= MAX_REFERENCE_LENGTH and "\x00" not in key)
            or (type(key) is int and -(2**63) <= key < 2**63)
            for key in keys
        )
    )


UNKNOWN_KEYS = ("global", "error")


def read_body(
    body: bytes,
    *,
    content_type: str,
    named_in_body: bool,
    unknown_keys: str | None = None,
    max_decoded_bytes: int = 4 * 1024**3,
    decoded_setting: str = "MIXREG_MAX_DECODED_BYTES",
    max_json_bytes: int | None = None,
    check_shape: formats.ShapeCheck | None = None,
) -> PredictInput:
    """Parse a predict body by its media type; 415 for another type, 422 naming what is wrong.

    ``named_in_body``: the JSON body carries ``model_id`` (``POST /predict``), else the model
    is named in the path. ``unknown_keys`` is the ``?unknown_keys=`` of an ``.npz`` body (a
    JSON body says it in its own field). 413 for an ``.npz`` body whose arrays take more than
    ``max_decoded_bytes`` decompressed (the setting ``decoded_setting``), for a JSON body of
    more than ``max_json_bytes``, and for what ``check_shape`` refuses: it sees the shape of
    an ``.npy`` or ``.npz`` body's ``X`` before its data are converted or decompressed.
    """
    media_type = media_type_of(content_type)
    if unknown_keys is not None and media_type != formats.NPZ_MEDIA_TYPE:
        raise InvalidInputError(
            "unknown_keys: the query parameter is for .npz bodies; a JSON body gives "
            "unknown_keys in the body"
        )
    if media_type == formats.NPY_MEDIA_TYPE:
        try:
            X = formats.read_npy_matrix(body, check_shape=check_shape)
            return PredictInput(model_id=None, X=X, y=None)
        except IngestError as exc:
            raise InvalidInputError(str(exc)) from None
    if media_type == formats.NPZ_MEDIA_TYPE:
        if unknown_keys is not None and unknown_keys not in UNKNOWN_KEYS:
            raise InvalidInputError(
                f"unknown_keys '{unknown_keys[:100]}' is unknown; choose global or error"
            )
        try:
            X, keys = formats.read_npz_keyed(
                body,
                max_decoded_bytes=max_decoded_bytes,
                decoded_setting=decoded_setting,
                check_shape=check_shape,
            )
        except DatasetTooLargeError as exc:
            raise DataTooLargeError(str(exc)) from None
        except IngestError as exc:
            raise InvalidInputError(str(exc)) from None
        return PredictInput(
            model_id=None, X=X, y=None, keys=keys, unknown_keys=unknown_keys or "global"
        )
    if not _is_json(media_type):
        raise UnsupportedMediaTypeError(
            f"Content-Type '{media_type}' is not accepted; send {formats.JSON_MEDIA_TYPE}, "
            f"{formats.NPY_MEDIA_TYPE} (an .npy array of rows) or {formats.NPZ_MEDIA_TYPE} (the "
            f"arrays X and keys, for a keyed model); curl -d sends "
            f"application/x-www-form-urlencoded unless given -H 'Content-Type: application/json'"
        )
    if not body:
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    if max_json_bytes is not None and len(body) > max_json_bytes:
        raise json_too_large(len(body), max_json_bytes)
    plain = _read_plain_json(body, named_in_body=named_in_body)
    if plain is not None:
        return plain
    schema = PredictRequest if named_in_body else ModelPredictRequest
    try:
        request = schema.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from None
    concomitant: Concomitant | None = None
    if isinstance(request.concomitant, dict):
        concomitant = {
            name: np.asarray(values, dtype=np.float64)
            for name, values in request.concomitant.items()
        }
    elif request.concomitant is not None:
        concomitant = np.asarray(request.concomitant, dtype=np.float64)
    return PredictInput(
        model_id=request.model_id if isinstance(request, PredictRequest) else None,
        X=np.asarray(request.X, dtype=np.float64),
        y=None if request.y is None else np.asarray(request.y, dtype=np.float64),
        groups=request.groups,
        concomitant=concomitant,
        keys=request.keys,
        unknown_keys=request.unknown_keys,
    )


def json_too_large(n_bytes: int, max_json_bytes: int) -> DataTooLargeError:
    """The 413 of a JSON predict body of ``n_bytes``, pointing to the binary formats."""
    return DataTooLargeError(
        f"the JSON body takes {n_bytes:,} bytes; a JSON predict body may take at most "
        f"{max_json_bytes:,} (MIXREG_MAX_PREDICT_JSON_BYTES); send big batches as "
        f"{formats.NPY_MEDIA_TYPE} (an .npy array of rows; {formats.NPZ_MEDIA_TYPE} with keys) "
        f"or as binary tensors of the Open Inference Protocol (/v2/models/{{model_id}}/infer)"
    )


def _is_json(media_type: str) -> bool:
    return media_type in ("", formats.JSON_MEDIA_TYPE) or media_type.endswith("+json")


def media_type_of(content_type: str) -> str:
    """The media type of a ``Content-Type`` header, without its parameters, in lower case."""
    return content_type.split(";")[0].strip().lower()


NPY_OUTPUTS = ("predictions", "probabilities", "expected", "most_likely", "most_likely_component")
"""What an ``.npy`` answer may hold (``?output=``); all but the first need a gated model."""

_MATRIX_OUTPUTS = ("predictions", "probabilities")
_GATED_VECTORS = ("expected", "most_likely", "most_likely_component")


def answer_outputs(
    lines: StoredLines, *, npy: bool, output: str, scored: bool, grouped: bool
) -> tuple[list[str], list[str]]:
    """The outputs an answer holds, as ``check_answer_size`` counts them: those of k values
    per row, and those of one value per row (``scored``: the request sent ``y``; ``grouped``:
    it sent ``groups``)."""
    if npy:
        return ([output], []) if output in _MATRIX_OUTPUTS else ([], [output])
    matrices, vectors = ["predictions"], []
    if scored:
        vectors.append("best_component")
    if grouped:
        matrices.append("group_posterior")
        vectors.append("group_line")
    if lines.gate is not None:
        matrices.append("probabilities")
        vectors.extend(_GATED_VECTORS)
    return matrices, vectors


def posterior_rows(group_line: NDArray[np.intp], posteriors: FloatArray) -> list[Any]:
    """The posteriors as JSON rows, ``None`` (null) for a row whose group the fit never saw."""
    rows: list[Any] = posteriors.tolist()
    for unseen in np.flatnonzero(group_line < 0):
        rows[unseen] = None
    return rows


@dataclass(frozen=True)
class EncodedAnswer:
    """An answer ready to send: its bytes, their media type and the headers naming the model."""

    body: bytes
    media_type: str
    headers: dict[str, str]

    def response(self) -> Response:
        """The answer as a Starlette response."""
        return Response(self.body, media_type=self.media_type, headers=self.headers)


def answer(
    lines: StoredLines, data: PredictInput, *, npy: bool, output: str = "predictions"
) -> EncodedAnswer:
    """Predict ``data`` with ``lines`` and encode the answer (``.npy`` of ``output`` if
    ``npy``).

    Every predict answer is computed here, whichever way the request came (the routes, or the
    edge middleware's fast path): once this returns, the prediction is complete.
    """
    predictions = predict_rows(lines, data.X, data.keys, unknown_keys=data.unknown_keys)
    groups_of_rows = None if data.groups is None else lines.lines_of_groups(data.groups)
    # Also refuses concomitant values sent to a model without a gate.
    columns = gate_columns(lines, data.X, data.concomitant)
    gated = None if lines.gate is None else predict_gated(lines, predictions, columns)
    if npy:
        if data.y is not None:
            raise NotAcceptableError(
                "an application/x-npy answer holds only the predictions; to score them "
                "against y (min_loss, best_component), accept application/json"
            )
        if groups_of_rows is not None:
            raise NotAcceptableError(
                "an application/x-npy answer holds only the predictions; for the lines of "
                "the groups (group_line, group_posterior), accept application/json"
            )
        if output != "predictions" and gated is None:
            raise InvalidInputError(
                f"output '{output}' needs a gated model; model {lines.model_id} has no gate"
            )
        array = predictions if gated is None or output == "predictions" else getattr(gated, output)
        return EncodedAnswer(formats.npy_bytes(array), formats.NPY_MEDIA_TYPE, answered_by(lines))
    payload: dict[str, object] = {"model_id": lines.model_id}
    if lines.version is not None:
        payload["registered_model"] = lines.registered_model
        payload["version"] = lines.version
    payload["predictions"] = predictions
    if data.y is not None:
        scores = score_predictions(predictions, data.y)
        payload["min_loss"] = scores.min_loss
        payload["best_component"] = scores.best_component
    if groups_of_rows is not None:
        group_line, group_posterior = groups_of_rows
        payload["group_line"] = group_line
        payload["group_posterior"] = posterior_rows(group_line, group_posterior)
    if gated is not None:
        payload["probabilities"] = gated.probabilities
        payload["expected"] = gated.expected
        payload["most_likely"] = gated.most_likely
        payload["most_likely_component"] = gated.most_likely_component
    return EncodedAnswer(formats.json_bytes(payload), formats.JSON_MEDIA_TYPE, answered_by(lines))


MODEL_ID_HEADER = "Mixreg-Model-Id"
MODEL_VERSION_HEADER = "Mixreg-Model-Version"


def answered_by(lines: StoredLines) -> dict[str, str]:
    """Headers naming the model that answered (and its version ``name/versions/N``), also on
    binary answers, which have no room for them in the body."""
    headers = {MODEL_ID_HEADER: lines.model_id}
    label = version_label(lines.registered_model, lines.version)
    if label is not None:
        headers[MODEL_VERSION_HEADER] = label
    return headers


async def lines_of(request: Request, reference: str) -> StoredLines:
    """The lines of the model ``reference`` names (an id, ``name@alias``, ...): resolved and
    decoded once, then from this process's caches without a thread hop."""
    state = request.app.state
    cache: ModelCache = state.model_cache
    resolver: ReferenceResolver = state.reference_resolver
    session_factory: sessionmaker[Session] = state.session_factory
    model_id = resolver.cached(reference)
    if model_id is None:
        model_id = await run_in_threadpool(resolver.resolve, reference, session_factory)
    lines = cache.get(model_id)
    if lines is None:
        lines = await run_in_threadpool(
            load_referenced_lines,
            cache=cache,
            resolver=resolver,
            session_factory=session_factory,
            reference=reference,
            model_id=model_id,
        )
    return lines


async def serve_predict(
    request: Request, *, path_model_id: str | None = None, query_model_id: str | None = None
) -> Response:
    """Answer a predict request: ``POST /predict`` (model named in the JSON body, or in
    ``?model_id=`` for an ``.npy`` body) or ``POST /models/{id}/predict`` (``path_model_id``).

    The app's model cache, session factory and settings are read from its state directly:
    resolving them as dependencies costs more than a single-row prediction.
    """
    settings: Settings = request.app.state.settings
    content_type = request.headers.get("content-type", "")
    # JSON is parsed holding the GIL (orjson, then the lists to arrays: one call each that no
    # other thread interrupts), so a big JSON body stops every request, /healthz included: a
    # 31 MB one held it for about a second. Bounded rather than sent to a parser process as
    # big dataset bodies are: at 8 MiB /healthz waits about 0.15 s at most, while .npy, .npz
    # and binary OIP bodies carry any batch faster than JSON would (bench/hostile_predict.py).
    # Refused from its declared length, before it is received (the received bytes are
    # counted too, in read_body).
    declared = request.headers.get("content-length", "")
    json_limit = settings.max_predict_json_bytes
    if _is_json(media_type_of(content_type)) and declared.isdigit() and int(declared) > json_limit:
        raise json_too_large(int(declared), json_limit)
    body = await request.body()
    inline = len(body) <= INLINE_BODY_BYTES
    named_in_body = path_model_id is None
    npy = formats.prefers_npy(request.headers.get("accept"))
    output = request.query_params.get("output", "predictions")
    if output not in NPY_OUTPUTS:
        # Checked for JSON answers too (which hold every output): the parameter is documented
        # with these values only.
        raise InvalidInputError(
            f"output '{output[:100]}' is unknown; choose one of {', '.join(NPY_OUTPUTS)}"
        )
    # A binary body names its model outside the body: the model is found first, so that the
    # rows its answer may hold are known from the body's header, before its data are
    # converted or decompressed (a small .npz of zeros can hold hundreds of megabytes).
    binary = media_type_of(content_type) in (formats.NPY_MEDIA_TYPE, formats.NPZ_MEDIA_TYPE)
    named_outside = path_model_id or query_model_id
    lines = await lines_of(request, named_outside) if binary and named_outside else None
    # A compressed body may not decode to more than an uncompressed one may take.
    max_decoded_bytes, decoded_setting = min(
        (settings.max_body_bytes, "MIXREG_MAX_BODY_BYTES"),
        (settings.max_decoded_bytes, "MIXREG_MAX_DECODED_BYTES"),
    )
    parse = functools.partial(
        read_body,
        body,
        content_type=content_type,
        named_in_body=named_in_body,
        unknown_keys=request.query_params.get("unknown_keys"),
        max_decoded_bytes=max_decoded_bytes,
        decoded_setting=decoded_setting,
        max_json_bytes=settings.max_predict_json_bytes,
        check_shape=functools.partial(
            _check_binary_shape, settings=settings, lines=lines, npy=npy, output=output
        ),
    )
    data = parse() if inline else await run_in_threadpool(parse)
    limits.check_data_shape(*data.X.shape, settings=settings, what="X")
    reference = path_model_id or data.model_id or query_model_id
    if reference is None:
        raise InvalidInputError(
            "name the model: an .npy body is sent to POST /models/{model_id}/predict or to "
            "POST /predict?model_id=... (an .npz body too)"
        )
    if lines is None:
        lines = await lines_of(request, reference)
    matrices, vectors = answer_outputs(
        lines, npy=npy, output=output, scored=data.y is not None, grouped=data.groups is not None
    )
    limits.check_answer_size(
        data.X.shape[0], lines.n_components, settings=settings, matrices=matrices, vectors=vectors
    )
    if inline and data.X.shape[0] * lines.coef.shape[0] <= INLINE_ANSWER_VALUES:
        encoded = answer(lines, data, npy=npy, output=output)
    else:
        encoded = await run_in_threadpool(answer, lines, data, npy=npy, output=output)
    _offer_to_log(request.app.state, reference, lines, data)
    return encoded.response()


def _offer_to_log(state: Any, reference: str, lines: StoredLines, data: Any) -> None:
    """Once answered: the prediction log's sampling check, and for a sampled request a queue
    append (the app's ``prediction_log``, made at startup)."""
    prediction_log = getattr(state, "prediction_log", None)
    if prediction_log is not None:
        prediction_log.offer(
            request_id=request_id_var.get(),
            reference=reference,
            lines=lines,
            X=data.X,
            keys=data.keys,
            unknown_keys=data.unknown_keys,
            concomitant=data.concomitant,
        )


def fast_json_predict(
    body: bytes,
    content_type: str | None,
    accept: str | None,
    *,
    cache: ModelCache,
    resolver: ReferenceResolver,
    settings: Settings,
    state: Any = None,
) -> EncodedAnswer | None:
    """The answer to a ``POST /predict`` JSON ``body`` of at most ``INLINE_BODY_BYTES`` (its
    ``Content-Type`` and ``Accept`` headers given), or None when it is not the common case — a
    plain body (model id and rows of numbers, as
    ``_read_plain_json`` reads), a JSON answer, a model already resolved and cached, an answer
    within the limits and small enough to compute on the event loop.

    The edge middleware calls it before routing; on None the request goes the whole way, to
    :func:`serve_predict`, which then answers it as it always would, errors included. Anything
    it accepts, :func:`serve_predict` answers with the same bytes and headers, and offers to
    the prediction log of the app whose ``state`` is given, as :func:`serve_predict` does.
    """
    if (
        not _is_json(media_type_of(content_type or ""))
        or len(body) > settings.max_predict_json_bytes
        or formats.prefers_npy(accept)
    ):
        return None
    data = _read_plain_json(body, named_in_body=True)
    if data is None or data.model_id is None:
        return None
    model_id = resolver.cached(data.model_id)
    lines = None if model_id is None else cache.get(model_id)
    if lines is None or data.X.shape[0] * lines.coef.shape[0] > INLINE_ANSWER_VALUES:
        return None
    try:
        limits.check_data_shape(*data.X.shape, settings=settings, what="X")
        matrices, vectors = answer_outputs(
            lines, npy=False, output="predictions", scored=data.y is not None, grouped=False
        )
        limits.check_answer_size(
            data.X.shape[0],
            lines.n_components,
            settings=settings,
            matrices=matrices,
            vectors=vectors,
        )
        encoded = answer(lines, data, npy=False)
    except ServiceError:
        # Explained by serve_predict, which reaches the same error.
        return None
    _offer_to_log(state, data.model_id, lines, data)
    return encoded


def _check_binary_shape(
    n_rows: int,
    n_features: int,
    what: str,
    *,
    settings: Settings,
    lines: StoredLines | None,
    npy: bool,
    output: str,
) -> None:
    """The limits a binary body's ``X`` of ``n_rows`` by ``n_features`` must be within, checked
    from its header: rows and features, and the size of the answer when the model is known."""
    limits.check_data_shape(n_rows, n_features, settings=settings, what=what)
    if lines is None:
        return
    matrices, vectors = answer_outputs(lines, npy=npy, output=output, scored=False, grouped=False)
    try:
        limits.check_answer_size(
            n_rows, lines.n_components, settings=settings, matrices=matrices, vectors=vectors
        )
    except DataTooLargeError as exc:
        raise DataTooLargeError(f"{what} has {n_rows:,} rows: {exc}") from None
