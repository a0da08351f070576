"""The SQL of registered models: names, their numbered versions, movable aliases and the audit
trail of every alias move.

As in every module of the store (:mod:`models_store.common`), functions take the session
first and everything else by keyword, flush but never commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from models_store.common import utcnow
from models_store.tables import Model, ModelAlias, ModelAliasEvent, ModelVersion, RegisteredModel


@dataclass(frozen=True)
class AliasMove:
    """An alias moved (or set for the first time, ``from_version`` None)."""

    alias: ModelAlias
    from_version: int | None


def get_registered_model(session: Session, *, name: str) -> RegisteredModel | None:
    """The registered model called ``name``, or None."""
    return session.get(RegisteredModel, name)


def ensure_registered_model(session: Session, *, name: str) -> RegisteredModel:
    """The registered model called ``name``, created (with no version) if there is none.

    A concurrent creation of the same name is absorbed: the loser reads the winner's row.
    """
    existing = session.get(RegisteredModel, name)
    if existing is not None:
        return existing
    try:
        with session.begin_nested():
            session.add(RegisteredModel(name=name, latest_version=0, created_at=utcnow()))
    except IntegrityError:
        pass
    registered = session.get(RegisteredModel, name)
    assert registered is not None  # inserted here or by the racer that won
    return registered


def create_version(session: Session, *, name: str, model_id: str) -> ModelVersion:
    """Make ``model_id`` the next version of ``name`` (created if needed): 1, 2, 3, ...

    The number is taken by one ``UPDATE ... SET latest_version = latest_version + 1``, which
    locks the name's row until the transaction ends, so two fits finishing together under one
    name get different versions. Versions are never reused.
    """
    ensure_registered_model(session, name=name)
    version = session.execute(
        update(RegisteredModel)
        .where(RegisteredModel.name == name)
        .values(latest_version=RegisteredModel.latest_version + 1)
        .returning(RegisteredModel.latest_version),
        execution_options={"synchronize_session": False},
    ).scalar_one()
    cached = session.identity_map.get(Session.identity_key(RegisteredModel, name))
    if cached is not None:
        session.expire(cached)
    model_version = ModelVersion(
        registered_model=name, version=version, model_id=model_id, created_at=utcnow()
    )
    session.add(model_version)
    session.flush()
    return model_version


def get_version(session: Session, *, name: str, version: int) -> ModelVersion | None:
    """Version ``version`` of ``name``, or None."""
    return session.get(ModelVersion, (name, version))


def latest_version(session: Session, *, name: str) -> ModelVersion | None:
    """The highest existing version of ``name``, or None if it has none."""
    return session.scalars(
        select(ModelVersion)
        .where(ModelVersion.registered_model == name)
        .order_by(ModelVersion.version.desc())
        .limit(1)
    ).first()


def version_of_model(session: Session, *, model_id: str) -> ModelVersion | None:
    """The registered version that ``model_id`` is, or None."""
    return session.scalars(select(ModelVersion).where(ModelVersion.model_id == model_id)).first()


def lock_version_of_model(session: Session, *, model_id: str) -> ModelVersion | None:
    """The registered version that ``model_id`` is, locked until the end of the transaction
    (PostgreSQL ``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` serializes writers), or None.

    Taken before deleting the model: an alias move onto this version (which locks it with
    :func:`set_alias`) then either commits first, so the delete sees the alias, or waits for
    the delete and finds the version gone.
    """
    return session.scalars(
        select(ModelVersion)
        .where(ModelVersion.model_id == model_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()


def _shared_version(session: Session, name: str, version: int) -> ModelVersion | None:
    return session.scalars(
        select(ModelVersion)
        .where(ModelVersion.registered_model == name, ModelVersion.version == version)
        .with_for_update(read=True)
        .execution_options(populate_existing=True)
    ).first()


def versions_of_models(session: Session, *, model_ids: Iterable[str]) -> dict[str, ModelVersion]:
    """The registered version of each of ``model_ids`` that is one, by model id."""
    wanted = list(model_ids)
    if not wanted:
        return {}
    rows = session.scalars(select(ModelVersion).where(ModelVersion.model_id.in_(wanted)))
    return {row.model_id: row for row in rows}


def list_versions(
    session: Session, *, name: str, before_version: int | None, limit: int
) -> list[ModelVersion]:
    """Up to ``limit`` versions of ``name``, newest first, older than ``before_version``."""
    query = select(ModelVersion).where(ModelVersion.registered_model == name)
    if before_version is not None:
        query = query.where(ModelVersion.version < before_version)
    return list(session.scalars(query.order_by(ModelVersion.version.desc()).limit(limit)))


def list_registered_models(
    session: Session, *, after_name: str | None, limit: int
) -> list[RegisteredModel]:
    """Up to ``limit`` registered models in name order, after ``after_name``."""
    query = select(RegisteredModel)
    if after_name is not None:
        query = query.where(RegisteredModel.name > after_name)
    return list(session.scalars(query.order_by(RegisteredModel.name).limit(limit)))


def get_alias(session: Session, *, name: str, alias: str) -> ModelAlias | None:
    """The alias ``alias`` of ``name``, or None."""
    return session.get(ModelAlias, (name, alias))


def list_aliases(session: Session, *, name: str) -> list[ModelAlias]:
    """Every alias of ``name``, by alias."""
    return list(
        session.scalars(
            select(ModelAlias).where(ModelAlias.registered_model == name).order_by(ModelAlias.alias)
        )
    )


def aliases_of_version(session: Session, *, name: str, version: int) -> list[str]:
    """The aliases that point at version ``version`` of ``name``."""
    return list(
        session.scalars(
            select(ModelAlias.alias)
            .where(ModelAlias.registered_model == name, ModelAlias.version == version)
            .order_by(ModelAlias.alias)
        )
    )


def _locked_alias(session: Session, name: str, alias: str) -> ModelAlias | None:
    return session.scalars(
        select(ModelAlias)
        .where(ModelAlias.registered_model == name, ModelAlias.alias == alias)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()


def set_alias(
    session: Session, *, name: str, alias: str, version: int, changed_by: str | None
) -> AliasMove | None:
    """Point ``alias`` of ``name`` at ``version`` and record the move; None (nothing changed)
    if there is no such version, e.g. deleted by a concurrent transaction.

    The target version is locked for share (PostgreSQL ``FOR SHARE``) while the alias moves
    onto it, so a concurrent delete of it waits and then sees the alias, or commits first and
    the move finds it gone, never a foreign-key violation. The alias row is locked while it
    moves (``FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE`` serializes writers), so concurrent
    moves are recorded in the order they happened, each with the version it replaced.
    """
    now = utcnow()
    if _shared_version(session, name, version) is None:
        return None
    current = _locked_alias(session, name, alias)
    if current is None:
        try:
            with session.begin_nested():
                current = ModelAlias(
                    registered_model=name,
                    alias=alias,
                    version=version,
                    updated_at=now,
                    updated_by=changed_by,
                )
                session.add(current)
            from_version = None
        except IntegrityError:
            # Created meanwhile by another request: move it as if it had been there.
            current = _locked_alias(session, name, alias)
            if current is None:
                raise
            from_version = current.version
    else:
        from_version = current.version
    current.version = version
    current.updated_at = now
    current.updated_by = changed_by
    session.add(
        ModelAliasEvent(
            registered_model=name,
            alias=alias,
            from_version=from_version,
            to_version=version,
            changed_by=changed_by,
            changed_at=now,
        )
    )
    session.flush()
    return AliasMove(alias=current, from_version=from_version)


def delete_alias(session: Session, *, name: str, alias: str, changed_by: str | None) -> bool:
    """Remove ``alias`` of ``name`` and record it; False if there was no such alias."""
    current = _locked_alias(session, name, alias)
    if current is None:
        return False
    session.add(
        ModelAliasEvent(
            registered_model=name,
            alias=alias,
            from_version=current.version,
            to_version=None,
            changed_by=changed_by,
            changed_at=utcnow(),
        )
    )
    session.delete(current)
    session.flush()
    return True


def alias_events(
    session: Session, *, name: str, before_id: int | None, limit: int
) -> list[ModelAliasEvent]:
    """Up to ``limit`` alias moves of ``name``, newest first, older than ``before_id``."""
    query = select(ModelAliasEvent).where(ModelAliasEvent.registered_model == name)
    if before_id is not None:
        query = query.where(ModelAliasEvent.id < before_id)
    return list(session.scalars(query.order_by(ModelAliasEvent.id.desc()).limit(limit)))


def models_not_behind_an_alias(session: Session, *, created_before: datetime) -> list[str]:
    """Ids of the models stored before ``created_before`` that no alias points at (through
    their version), oldest first."""
    behind_an_alias = select(ModelVersion.model_id).join(
        ModelAlias,
        (ModelAlias.registered_model == ModelVersion.registered_model)
        & (ModelAlias.version == ModelVersion.version),
    )
    return list(
        session.scalars(
            select(Model.id)
            .where(Model.created_at < created_before, Model.id.not_in(behind_an_alias))
            .order_by(Model.created_at, Model.id)
        )
    )
