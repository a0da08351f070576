"""The SQL of fitted models: stored from a fit's record, read, listed and deleted, with a
grouped model's group table and a keyed model's chunks of keys.

A model is stored from one record (:class:`ModelRecord`), whose fields are the columns;
other functions take the session first and everything else by keyword. All flush but never
commit (:mod:`models_store.common`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    delete,
    select,
)
from sqlalchemy.orm import Session

from models_store.codecs import (
    GroupTable,
    decode_group_table,
    encode_group_table,
    to_json_value,
)
from models_store.common import (
    PageKey,
    encode_keyed_chunk,
    execute_counting,
    is_id,
    join_keyed_chunks,
    new_id,
    newest_first,
    utcnow,
)
from models_store.tables import (
    KeyedModelChunk,
    Model,
)


@dataclass(frozen=True)
class ModelRecord:
    """A fitted model as it is stored: each field is the column of the same name (arrays as
    array-likes, records as mappings), but for the group table, stored from three fields.

    ``coef`` has shape (n_components, n_features); ``intercept`` and ``shares`` have shape
    (n_components,). ``log_likelihood``, ``bic`` and ``n_parameters`` score the lines as a
    Gaussian mixture on the training rows; ``candidates`` is the search record of ``auto``;
    ``uncertainty`` the table of estimates with their standard errors and intervals.
    A grouped fit gives ``group_labels`` (its training groups), ``group_lines`` (the line of
    each) and, for EM, ``group_posteriors`` (each group's posterior over the lines), stored
    compactly (``codecs.encode_group_table``), and its ``group_metrics``.
    ``gate`` is the fitted gate of a gated mixture (JSON numbers).
    """

    job_id: str | None
    dataset_id: str
    name: str | None
    algorithm: str
    n_components: int
    n_features: int
    feature_names: Sequence[str]
    fit_intercept: bool
    params: Mapping[str, Any]
    seed: int | None
    coef: npt.ArrayLike
    intercept: npt.ArrayLike
    shares: npt.ArrayLike
    train_min_loss: float
    holdout_min_loss: float | None
    baseline: Mapping[str, Any]
    n_train: int
    n_holdout: int
    loss_history: npt.ArrayLike
    n_iter: int
    fit_seconds: float
    converged: bool | None = None
    log_likelihood: float | None = None
    bic: float | None = None
    n_parameters: int | None = None
    candidates: Sequence[Mapping[str, Any]] | None = None
    warnings: Sequence[str] = ()
    weights_column: str | None = None
    groups_column: str | None = None
    group_labels: npt.ArrayLike | None = None
    group_lines: npt.ArrayLike | None = None
    group_posteriors: npt.ArrayLike | None = None
    group_metrics: Mapping[str, Any] | None = None
    uncertainty: Mapping[str, Any] | None = None
    gate: Mapping[str, Any] | None = None
    split_by: str | None = None
    keyed_summary: Mapping[str, Any] | None = None


_GROUP_TABLE_FIELDS = ("group_labels", "group_lines", "group_posteriors")
_JSON_RECORD_FIELDS = (
    "params",
    "baseline",
    "group_metrics",
    "uncertainty",
    "gate",
    "keyed_summary",
)
_ARRAY_FIELDS = ("coef", "intercept", "shares")
_FLOAT_FIELDS = ("train_min_loss", "fit_seconds", "holdout_min_loss", "log_likelihood", "bic")


def _check_shapes(record: ModelRecord) -> None:
    k, d = record.n_components, record.n_features
    coef = np.shape(record.coef)
    if coef != (k, d):
        raise ValueError(f"coef must have shape ({k}, {d}), got {coef}")
    for label in ("intercept", "shares"):
        shape = np.shape(getattr(record, label))
        if shape != (k,):
            raise ValueError(f"{label} must have shape ({k},), got {shape}")
    if len(record.feature_names) != d:
        raise ValueError(f"got {len(record.feature_names)} feature names for {d} features")


def create_model(session: Session, record: ModelRecord) -> Model:
    """Store the fitted model ``record``; arrays are kept as JSON lists of exactly the same
    float64 values. Raises ``ValueError`` if its arrays do not have the shapes its
    ``n_components`` and ``n_features`` say."""
    _check_shapes(record)
    columns = {
        field.name: getattr(record, field.name)
        for field in fields(record)
        if field.name not in _GROUP_TABLE_FIELDS
    }
    for name in _ARRAY_FIELDS:
        columns[name] = to_json_value(np.asarray(columns[name], dtype=np.float64))
    for name in _JSON_RECORD_FIELDS:
        columns[name] = None if columns[name] is None else to_json_value(dict(columns[name]))
    for name in _FLOAT_FIELDS:
        columns[name] = None if columns[name] is None else float(columns[name])
    columns["feature_names"] = list(record.feature_names)
    columns["loss_history"] = to_json_value(
        np.asarray(record.loss_history, dtype=np.float64).ravel()
    )
    if record.candidates is not None:
        columns["candidates"] = to_json_value([dict(item) for item in record.candidates])
    columns["warnings"] = [str(warning) for warning in record.warnings]
    model = Model(
        id=new_id(),
        created_at=utcnow(),
        group_table=(
            None
            if record.group_labels is None or record.group_lines is None
            else encode_group_table(
                record.group_labels, record.group_lines, record.group_posteriors
            )
        ),
        **columns,
    )
    session.add(model)
    session.flush()
    return model


def get_model(session: Session, *, model_id: str) -> Model | None:
    """Return the model with this id, or None."""
    return session.get(Model, model_id) if is_id(model_id) else None


def list_models(
    session: Session, *, limit: int, offset: int, after: PageKey | None = None
) -> tuple[list[Model], int]:
    """Return a page of models, newest first (after the row ``after``), and the total."""
    return newest_first(session, select(Model), Model, limit=limit, offset=offset, after=after)


def existing_model_ids(session: Session, *, model_ids: Iterable[str]) -> set[str]:
    """The ids among ``model_ids`` whose model still exists."""
    wanted = [model_id for model_id in model_ids if is_id(model_id)]
    if not wanted:
        return set()
    return set(session.scalars(select(Model.id).where(Model.id.in_(wanted))))


def delete_model(session: Session, *, model_id: str) -> bool:
    """Delete a model; False if there was none. Jobs keep their (now dangling) model id."""
    if not is_id(model_id):
        return False
    deleted = execute_counting(session, delete(Model).where(Model.id == model_id)) == 1
    cached = session.identity_map.get(Session.identity_key(Model, model_id))
    if cached is not None:
        session.expunge(cached)
    return deleted


def load_group_table(session: Session, *, model_id: str) -> GroupTable | None:
    """A grouped model's group labels, line of each (and posteriors, for EM), or None for a
    model without groups."""
    stored = session.scalar(select(Model.group_table).where(Model.id == model_id))
    return None if stored is None else decode_group_table(stored)


def load_keyed_arrays(session: Session, *, model_id: str) -> dict[str, npt.NDArray[Any]]:
    """Every chunk of the keyed model ``model_id`` joined in key order: name -> array."""
    return join_keyed_chunks(
        session,
        select(KeyedModelChunk.data)
        .where(KeyedModelChunk.model_id == model_id)
        .order_by(KeyedModelChunk.position),
    )


def add_keyed_model_chunks(
    session: Session,
    *,
    model_id: str,
    arrays: Mapping[str, npt.NDArray[Any]],
    keys_per_chunk: int,
) -> int:
    """Store every key's lines of the keyed model ``model_id`` (the arrays of
    :func:`load_keyed_arrays`, keys sorted) as chunks of ``keys_per_chunk`` keys, as a keyed
    job stores them; the number of chunks."""
    n_keys = len(arrays["keys"])
    positions = range(0, n_keys, keys_per_chunk)
    for position, start in enumerate(positions):
        chunk = {name: values[start : start + keys_per_chunk] for name, values in arrays.items()}
        session.add(
            KeyedModelChunk(
                model_id=model_id,
                position=position,
                n_keys=len(chunk["keys"]),
                fitted_attempt=None,
                fitted_by=None,
                data=encode_keyed_chunk(chunk),
            )
        )
    session.flush()
    return len(positions)
