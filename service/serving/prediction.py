"""Predictions from stored θ lists, with an in-process cache of decoded models."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy.orm import Session, sessionmaker

from mixreg import KeyedMixture, gate_probabilities, min_loss, predict_lines
from mixreg.service_support import STATUSES
from models_store import models as model_store
from models_store import registry
from models_store.codecs import decode_group_table
from models_store.session import read_scope, session_scope
from models_store.tables import Model, ModelVersion
from service.data import model_references
from service.errors import ConflictError, InvalidInputError, NotFoundError
from service.schemas import Component, KeyLines, PredictResponse
from service.serving import references
from service.serving.formats import NPZ_MEDIA_TYPE

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class StoredGate:
    """The gate of a stored gated model: ``softmax(<z, coef_j> + intercept_j)``."""

    coef: FloatArray
    intercept: FloatArray
    concomitant: list[str] | None
    """The dataset columns it reads (None: the features)."""


@dataclass(frozen=True)
class GatedPredictions:
    """A gated model's answers besides the k values."""

    probabilities: FloatArray
    expected: FloatArray
    most_likely: FloatArray
    most_likely_component: NDArray[np.intp]


@dataclass(frozen=True)
class StoredLines:
    """The k lines of a stored model as arrays, exactly as fitted."""

    model_id: str
    coef: FloatArray
    intercept: FloatArray
    # The registered model and version the model is, if it is one.
    registered_model: str | None = None
    version: int | None = None
    # A grouped model's training groups (sorted: str or float64 labels), the line of each and,
    # for EM, each one's posterior over the lines.
    group_labels: NDArray[Any] | None = None
    group_lines: NDArray[np.intp] | None = None
    group_posteriors: FloatArray | None = None
    gate: StoredGate | None = None
    # A keyed model: its key column and every key's lines, decoded once from their chunks
    # (the lines above are then the global model's, for keys it does not know).
    split_by: str | None = None
    keyed: KeyedMixture | None = None
    # Each key with lines -> its position in ``keyed``: a hash lookup for small requests, where
    # a binary search's array set-up would cost more than the prediction.
    key_positions: dict[str | int, int] | None = None

    @classmethod
    def of_model(cls, model: Model, version: ModelVersion | None = None) -> StoredLines:
        """Decode the JSON numbers of ``model`` (they round-trip bit for bit) and its group
        table if it has one; ``version`` is the registered version it is, if any."""
        shape = (model.n_components, model.n_features)
        coef = np.asarray(model.coef, dtype=np.float64).reshape(shape)
        table = None if model.group_table is None else decode_group_table(model.group_table)
        return cls(
            model_id=model.id,
            coef=coef,
            intercept=np.asarray(model.intercept, dtype=np.float64).reshape(model.n_components),
            registered_model=None if version is None else version.registered_model,
            version=None if version is None else version.version,
            group_labels=None if table is None else table.labels,
            group_lines=None if table is None else table.lines,
            group_posteriors=None if table is None else table.posteriors,
            gate=None
            if model.gate is None
            else StoredGate(
                coef=np.asarray(model.gate["coef"], dtype=np.float64).reshape(
                    model.n_components, -1
                ),
                intercept=np.asarray(model.gate["intercept"], dtype=np.float64),
                concomitant=model.gate["concomitant"],
            ),
        )

    def lines_of_groups(
        self, groups: Sequence[str | int | float]
    ) -> tuple[NDArray[np.intp], FloatArray]:
        """The line of each of ``groups`` (-1 for a group the fit never saw) and its posterior
        over the lines (n x k; NaN rows for unseen groups; the one-hot of its line for a fit
        that kept no posteriors); 422 if the model was not fitted with groups.

        Labels compare as the stored ones: with a text column as text (a number as its
        JSON text), with a number column as numbers (a text label is an unknown group).
        """
        if self.group_labels is None or self.group_lines is None:
            raise InvalidInputError(
                f"groups: model {self.model_id} was not fitted with groups; predict without "
                f"groups, or fit with groups"
            )
        known_labels = self.group_labels
        numeric = known_labels.dtype.kind == "f"
        if numeric:
            asked = np.array(
                [np.nan if isinstance(label, str) else label for label in groups], dtype=np.float64
            )
        else:
            asked = np.array([str(label) for label in groups], dtype=str)
        at = np.searchsorted(known_labels, asked)
        inside = at < known_labels.size
        known = np.zeros(asked.size, dtype=bool)
        known[inside] = known_labels[at[inside]] == asked[inside]
        position = np.where(known, at, 0)
        lines: NDArray[np.intp] = np.where(known, self.group_lines[position], -1)
        posteriors = (
            self.group_posteriors[position]
            if self.group_posteriors is not None
            else np.eye(self.n_components)[self.group_lines[position]]
        )
        posteriors[~known] = np.nan
        return lines, posteriors

    @property
    def n_features(self) -> int:
        """Features the model expects per row."""
        return int(self.coef.shape[1])

    @property
    def n_components(self) -> int:
        """The model's k lines: the predictions per row."""
        return int(self.coef.shape[0])

    def memory_bytes(self) -> int:
        """About the bytes these lines hold in memory (arrays, text keys and labels, the key
        lookup table): what the model cache counts against ``MIXREG_MODEL_CACHE_BYTES``."""
        arrays: list[NDArray[Any] | None] = [
            self.coef,
            self.intercept,
            self.group_labels,
            self.group_lines,
            self.group_posteriors,
        ]
        if self.gate is not None:
            arrays += [self.gate.coef, self.gate.intercept]
        if self.keyed is not None:
            keyed = self.keyed
            arrays += [
                keyed.keys,
                keyed.coef,
                keyed.intercept,
                keyed.shares,
                keyed.min_loss,
                keyed.n_rows,
                keyed.status,
            ]
        total = sum(_array_bytes(array) for array in arrays if array is not None)
        if self.key_positions is not None:
            total += sys.getsizeof(self.key_positions) + _POSITION_BYTES * len(self.key_positions)
            if self.keyed is not None and self.keyed.keys.dtype != object:
                # Keys read as fixed-width text become new Python strings in the table.
                total += sum(map(sys.getsizeof, self.key_positions))
        return total


_POSITION_BYTES = 32
"""About what a position (a Python int) takes in a key lookup table."""


def _array_bytes(array: NDArray[Any]) -> int:
    """An array's bytes, with the Python objects of an object array (texts)."""
    if array.dtype != object:
        return int(array.nbytes)
    return int(array.nbytes) + sum(map(sys.getsizeof, array.tolist()))


class ModelCache:
    """A thread-safe LRU cache of decoded models, so a cache hit needs no database access.

    It holds at most ``capacity`` models and ``max_bytes`` bytes of them
    (:meth:`StoredLines.memory_bytes`): a few keyed models of many keys weigh more than
    thousands of plain ones. A model larger than ``max_bytes`` on its own is served but not
    kept. Models never change after they are stored; deleting one evicts it.
    """

    def __init__(self, capacity: int, max_bytes: int | None = None) -> None:
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[StoredLines, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, model_id: str) -> StoredLines | None:
        """The cached lines of ``model_id``, if present (marking them recently used)."""
        with self._lock:
            entry = self._entries.get(model_id)
            if entry is None:
                return None
            self._entries.move_to_end(model_id)
            return entry[0]

    def put(self, lines: StoredLines) -> None:
        """Cache ``lines``, evicting the least recently used entries while the cache holds
        too many models or bytes."""
        size = lines.memory_bytes() if self._max_bytes is not None else 0
        with self._lock:
            self._pop(lines.model_id)
            if self._max_bytes is not None and size > self._max_bytes:
                return
            self._entries[lines.model_id] = (lines, size)
            self._bytes += size
            while len(self._entries) > self._capacity or (
                self._max_bytes is not None and self._bytes > self._max_bytes
            ):
                self._pop(next(iter(self._entries)))

    def _pop(self, model_id: str) -> None:
        entry = self._entries.pop(model_id, None)
        if entry is not None:
            self._bytes -= entry[1]

    @property
    def bytes(self) -> int:
        """About the bytes of the cached models."""
        with self._lock:
            return self._bytes

    def evict(self, model_id: str) -> None:
        """Forget ``model_id``."""
        with self._lock:
            self._pop(model_id)

    def model_ids(self) -> list[str]:
        """The ids of the cached models."""
        with self._lock:
            return list(self._entries)

    def __contains__(self, model_id: object) -> bool:
        with self._lock:
            return model_id in self._entries


def load_lines(
    *, cache: ModelCache, session_factory: sessionmaker[Session], model_id: str
) -> StoredLines:
    """The lines of ``model_id`` from the cache, else from the database; 404 if none."""
    lines = cache.get(model_id)
    if lines is not None:
        return lines
    with read_scope(session_factory) as session:
        model = model_store.get_model(session, model_id=model_id)
        if model is None:
            raise NotFoundError(f"model {model_id} does not exist")
        lines = StoredLines.of_model(model, registry.version_of_model(session, model_id=model.id))
        if model.split_by is not None:
            keyed = keyed_lines(model_store.load_keyed_arrays(session, model_id=model.id))
            lines = replace(
                lines, split_by=model.split_by, keyed=keyed, key_positions=positions_of(keyed)
            )
    cache.put(lines)
    return lines


def load_referenced_lines(
    *,
    cache: ModelCache,
    resolver: references.ReferenceResolver,
    session_factory: sessionmaker[Session],
    reference: str,
    model_id: str,
) -> StoredLines:
    """The lines of the model ``reference`` names, which resolved to ``model_id``; 404 if none.

    When ``model_id`` is gone although ``reference`` named it a moment ago (an alias moved and
    its old version deleted, here, in another process or by retention), ``reference`` is looked
    up again: a prediction by alias never fails because the alias moved.
    """
    for _ in range(_LOOKUPS_AFTER_A_MISS):
        try:
            return load_lines(cache=cache, session_factory=session_factory, model_id=model_id)
        except NotFoundError:
            again = resolver.resolve_again(reference, session_factory, missing=model_id)
            if again is None:
                raise
            model_id = again
    return load_lines(cache=cache, session_factory=session_factory, model_id=model_id)


_LOOKUPS_AFTER_A_MISS = 3
"""Lookups of a reference after its model was found deleted: each finds a newer target, gone
again only if the alias moved on and that version was deleted too within the lookup."""


def keyed_lines(arrays: dict[str, NDArray[Any]]) -> KeyedMixture:
    """Every key's lines of a keyed model from its stored arrays (keys in sorted order)."""
    return KeyedMixture(
        keys=arrays["keys"],
        coef=arrays["coef"],
        intercept=arrays["intercept"],
        shares=arrays["shares"],
        min_loss=arrays["min_loss"],
        n_rows=arrays["n_rows"],
        status=arrays["status"],
    )


def key_lines(lines: StoredLines, key: str) -> KeyLines:
    """One key's lines of a keyed model (a key of an integer-keyed model written in decimal);
    404 if the model has no such key, 422 if it is not keyed."""
    keyed = lines.keyed
    if keyed is None:
        raise InvalidInputError(f"model {lines.model_id} is not keyed (fitted without split_by)")
    asked: str | int = key
    if keyed.keys.dtype.kind in "iu":
        try:
            asked = int(key)
        except ValueError:
            raise NotFoundError(
                f"model {lines.model_id} has integer keys; '{key[:100]}' is none of them"
            ) from None
    found = np.searchsorted(keyed.keys, np.asarray([asked]))[0]
    if found >= keyed.keys.size or keyed.keys[found] != asked:
        raise NotFoundError(f"model {lines.model_id} has no key {asked!r}")
    status = STATUSES[int(keyed.status[found])]
    has_lines = status in ("fitted", "k1")
    loss = float(keyed.min_loss[found])
    return KeyLines(
        model_id=lines.model_id,
        key=asked,
        status=status,
        n_rows=int(keyed.n_rows[found]),
        min_loss=loss if np.isfinite(loss) else None,
        components=[
            Component(coef=coef.tolist(), intercept=float(intercept), share=float(share))
            for coef, intercept, share in zip(
                keyed.coef[found], keyed.intercept[found], keyed.shares[found], strict=True
            )
        ]
        if has_lines
        else [],
    )


def positions_of(keyed: KeyedMixture) -> dict[str | int, int]:
    """Each key that has lines (fitted, or one line) -> its position."""
    with_lines = np.flatnonzero(keyed.status <= STATUSES.index("k1"))
    return dict(zip(keyed.keys[with_lines].tolist(), with_lines.tolist(), strict=True))


SMALL_REQUEST_ROWS = 16
"""Keyed requests of up to this many rows find their keys by hash lookups; larger ones by one
binary search over the sorted keys."""


def predict_rows(
    lines: StoredLines,
    X: FloatArray,
    keys: Sequence[str | int] | None,
    *,
    unknown_keys: str = "global",
) -> FloatArray:
    """The (n, k) predictions of ``X``: of a keyed model, each row by its key's lines (an
    unknown key by the global model's, or a 422 naming it); 422 for keys to a model without
    them, or none to a keyed model."""
    if lines.keyed is None:
        if keys is not None:
            raise InvalidInputError(
                f"keys: model {lines.model_id} is not keyed (fitted without split_by); "
                f"predict without keys"
            )
        return predict_matrix(lines, X)
    if keys is None:
        raise InvalidInputError(
            f"keys: model {lines.model_id} has lines per '{lines.split_by}'; give each row's "
            f"key in keys (unknown_keys: global predicts by the model of all rows); in binary, "
            f"send an {NPZ_MEDIA_TYPE} body of the arrays X and keys"
        )
    if X.shape[1] != lines.n_features:
        raise InvalidInputError(
            f"model {lines.model_id} expects {lines.n_features} features, got {X.shape[1]}"
        )
    if lines.key_positions is not None and len(keys) <= SMALL_REQUEST_ROWS:
        table = lines.key_positions
        if len(keys) == 1 and keys[0] in table:
            # The single-row hot path: one key's (k, d) lines times the row.
            at = table[keys[0]]
            single: FloatArray = X @ lines.keyed.coef[at].T
            single += lines.keyed.intercept[at]
            _check_finite_predictions(single)
            return single
        # A text key asked of an integer-keyed model (or the reverse) is unknown, as below.
        positions = np.array([table.get(key, -1) for key in keys], dtype=np.intp)
    else:
        positions = lines.keyed.positions(np.asarray(keys))
    unknown = positions < 0
    if unknown.any() and unknown_keys == "error":
        missing = list(dict.fromkeys(keys[int(i)] for i in np.flatnonzero(unknown)))
        shown = missing[:5]
        raise InvalidInputError(
            f"keys: {len(missing)} keys have no lines in "
            f"model {lines.model_id} (e.g. {', '.join(map(repr, shown))}); unknown_keys: "
            f"global predicts them by the model of all rows"
        )
    found = np.where(unknown, 0, positions)
    with np.errstate(over="ignore", invalid="ignore"):
        predictions: FloatArray = np.einsum("nd,nkd->nk", X, lines.keyed.coef[found])
        predictions += lines.keyed.intercept[found]
        if unknown.any():
            predictions[unknown] = predict_lines(X[unknown], lines.coef, lines.intercept)
    _check_finite_predictions(predictions)
    return predictions


def predict(
    lines: StoredLines, X_rows: Sequence[Sequence[float]], y_values: Sequence[float] | None = None
) -> PredictResponse:
    """k predictions per row of ``X_rows``; with ``y_values`` also the min-loss and best lines.

    ``X_rows`` must already be a finite rectangular matrix (the request schema checks it).
    """
    X = np.asarray(X_rows, dtype=np.float64)
    predictions = predict_rows(lines, X, None)
    response = PredictResponse(
        model_id=lines.model_id,
        registered_model=lines.registered_model,
        version=lines.version,
        predictions=predictions.tolist(),
    )
    if y_values is None:
        return response
    scored = score_predictions(predictions, np.asarray(y_values, dtype=np.float64))
    response.min_loss = scored.min_loss
    response.best_component = scored.best_component.tolist()
    return response


def predict_matrix(lines: StoredLines, X: FloatArray) -> FloatArray:
    """The (n, k) predictions of the finite (n, d) matrix ``X``; 422 if ``d`` is not the
    model's or a prediction overflows."""
    if X.shape[1] != lines.n_features:
        raise InvalidInputError(
            f"model {lines.model_id} expects {lines.n_features} features, got {X.shape[1]}"
        )
    # Overflow is reported below as a precise error instead of a RuntimeWarning.
    with np.errstate(over="ignore", invalid="ignore"):
        predictions = predict_lines(X, lines.coef, lines.intercept)
    _check_finite_predictions(predictions)
    return predictions


Concomitant = FloatArray | dict[str, FloatArray]
"""A predict request's concomitant columns: rows of values, or named columns."""


def gate_columns(lines: StoredLines, X: FloatArray, concomitant: Concomitant | None) -> FloatArray:
    """The columns the model's gate reads for rows ``X``: the features, or the request's
    concomitant values in the gate's order; 422 naming what is missing or superfluous."""
    gate = lines.gate
    if gate is None:
        if concomitant is not None:
            raise InvalidInputError(
                f"model {lines.model_id} has no gate: send no concomitant values"
            )
        return X
    if gate.concomitant is None:
        if concomitant is not None:
            raise InvalidInputError(
                f"the gate of model {lines.model_id} reads the features: send no concomitant values"
            )
        return X
    names = gate.concomitant
    if concomitant is None:
        raise InvalidInputError(
            f"the gate of model {lines.model_id} reads the columns {', '.join(names)}: send "
            f"their values as concomitant (rows of {len(names)} values, or "
            f'{{"{names[0]}": [...], ...}})'
        )
    if isinstance(concomitant, dict):
        missing = [name for name in names if name not in concomitant]
        if missing:
            raise InvalidInputError(
                f"concomitant lacks the column '{missing[0]}' that the gate of model "
                f"{lines.model_id} reads"
            )
        return np.column_stack([concomitant[name] for name in names])
    if concomitant.shape[1] != len(names):
        raise InvalidInputError(
            f"concomitant rows have {concomitant.shape[1]} values, but the gate of model "
            f"{lines.model_id} reads {len(names)} columns ({', '.join(names)})"
        )
    return concomitant


def predict_gated(
    lines: StoredLines, predictions: FloatArray, columns: FloatArray
) -> GatedPredictions:
    """The gate's probabilities for the rows' ``columns`` and what they choose among the
    rows' ``predictions`` (n, k)."""
    assert lines.gate is not None
    with np.errstate(over="ignore", invalid="ignore"):
        probabilities = gate_probabilities(columns, lines.gate.coef, lines.gate.intercept)
    if not np.isfinite(probabilities).all():
        row = int(np.argwhere(~np.isfinite(probabilities))[0][0])
        raise InvalidInputError(
            f"the gate's probabilities of row {row} overflow a float64; scale its values down"
        )
    chosen = np.argmax(probabilities, axis=1)
    expected = np.einsum("ij,ij->i", predictions, probabilities)
    _check_finite_predictions(expected[:, None])
    return GatedPredictions(
        probabilities=probabilities,
        expected=expected,
        most_likely=predictions[np.arange(predictions.shape[0]), chosen],
        most_likely_component=chosen,
    )


@dataclass(frozen=True)
class Scores:
    """How well predictions fit known targets: the min-loss and each row's best line."""

    min_loss: float
    best_component: NDArray[np.intp]


def score_predictions(predictions: FloatArray, y: FloatArray) -> Scores:
    """The min-loss of ``predictions`` against ``y`` and each row's best component; 422 if the
    min-loss overflows."""
    with np.errstate(over="ignore", invalid="ignore"):
        squared_errors = (y[:, np.newaxis] - predictions) ** 2
        loss = float(min_loss(y, predictions))
    if not np.isfinite(loss):
        raise InvalidInputError(
            "the min-loss of these predictions overflows a float64; scale y and X down"
        )
    return Scores(min_loss=loss, best_component=np.argmin(squared_errors, axis=1))


def _check_finite_predictions(predictions: FloatArray) -> None:
    finite = np.isfinite(predictions)
    if finite.all():
        return
    bad = np.argwhere(~finite)
    if bad.size:
        row, component = (int(index) for index in bad[0])
        raise InvalidInputError(
            f"the prediction of component {component} for X row {row} overflows a float64; "
            f"scale X down"
        )


def delete_model(
    *,
    cache: ModelCache,
    session_factory: sessionmaker[Session],
    reference: str,
    resolver: references.ReferenceResolver | None = None,
) -> None:
    """Delete the model ``reference`` names (its id, ``name/versions/N``, ...), then evict it
    from the cache (and from what ``resolver`` remembers) once that is committed; 404 if none,
    409 if it is a registered version that an alias points at."""
    with session_scope(session_factory) as session:
        model_id = model_references.resolve_in_session(
            session, model_references.parse_reference(reference)
        )
        # Locked before the aliases are read: an alias moving onto this version meanwhile
        # (which locks it too) either commits first, and is seen (409), or waits for the delete.
        version = registry.lock_version_of_model(session, model_id=model_id)
        if version is not None:
            aliases = registry.aliases_of_version(
                session, name=version.registered_model, version=version.version
            )
            if aliases:
                names = ", ".join(f"{version.registered_model}@{alias}" for alias in aliases)
                raise ConflictError(
                    f"model {model_id} is version {version.version} of "
                    f"{version.registered_model}, which {names} points at; move the alias to "
                    f"another version first"
                )
        if not model_store.delete_model(session, model_id=model_id):
            raise NotFoundError(f"model {model_id} does not exist")
    cache.evict(model_id)
    if resolver is not None:
        resolver.forget_model(model_id)
