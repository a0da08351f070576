"""Registered models: names whose successive fits are versions 1, 2, 3, ..., and aliases
(``production``, ``staging``, any name) that point at a version and move atomically, each move
recorded with the API key that made it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Response
from sqlalchemy.orm import Session

from models_store import registry
from models_store.tables import ModelAlias, ModelVersion, RegisteredModel
from service.api import cursors
from service.api.deps import ReferenceResolverDep, SessionDep
from service.auth.middleware import ApiKeyDep
from service.data import model_references
from service.errors import ConflictError, NotFoundError
from service.schemas import (
    AliasEventOut,
    AliasIn,
    AliasOut,
    CursorPage,
    ModelVersionOut,
    RegisteredModelOut,
)

router = APIRouter(prefix="/registered-models", tags=["registered-models"])

Name = Annotated[str, Path(description="the registered model's name")]
Alias = Annotated[str, Path(description="an alias: 1 to 128 letters, digits, '_', '.' or '-'")]
Version = Annotated[int, Path(description="a version number", ge=1, le=999_999_999)]
Limit = Annotated[int, Query(ge=1, le=500)]
Cursor = Annotated[
    str | None, Query(max_length=512, description="next_cursor of the previous page")
]


def _registered(session: Session, name: str) -> RegisteredModel:
    registered = registry.get_registered_model(session, name=name)
    if registered is None:
        raise NotFoundError(f"registered model {name[:140]} does not exist")
    return registered


def _version_out(version: ModelVersion, aliases: list[str]) -> ModelVersionOut:
    return ModelVersionOut(
        registered_model=version.registered_model,
        version=version.version,
        model_id=version.model_id,
        aliases=aliases,
        created_at=version.created_at,
        url=f"/models/{version.registered_model}/versions/{version.version}",
    )


def _alias_out(alias: ModelAlias, model_id: str, previous_version: int | None = None) -> AliasOut:
    return AliasOut(
        registered_model=alias.registered_model,
        alias=alias.alias,
        version=alias.version,
        model_id=model_id,
        previous_version=previous_version,
        updated_at=alias.updated_at,
        updated_by=alias.updated_by,
        url=f"/models/{alias.registered_model}@{alias.alias}",
    )


@router.get("", response_model=CursorPage[RegisteredModelOut])
def list_(
    session: SessionDep, limit: Limit = 50, cursor: Cursor = None
) -> CursorPage[RegisteredModelOut]:
    """Registered models in name order."""
    after = None if cursor is None else cursors.decode(cursor, types=(str,))[0]
    rows = registry.list_registered_models(session, after_name=after, limit=limit + 1)
    page = rows[:limit]
    return CursorPage[RegisteredModelOut](
        items=[_registered_out(session, row) for row in page],
        next_cursor=cursors.encode(page[-1].name) if len(rows) > limit else None,
    )


def _registered_out(session: Session, registered: RegisteredModel) -> RegisteredModelOut:
    return RegisteredModelOut(
        name=registered.name,
        latest_version=registered.latest_version,
        aliases={
            alias.alias: alias.version
            for alias in registry.list_aliases(session, name=registered.name)
        },
        created_at=registered.created_at,
        url=f"/registered-models/{registered.name}",
    )


@router.get("/{name}", response_model=RegisteredModelOut)
def get(name: Name, session: SessionDep) -> RegisteredModelOut:
    """A registered model: its latest version and where its aliases point."""
    return _registered_out(session, _registered(session, name))


@router.get("/{name}/versions", response_model=CursorPage[ModelVersionOut])
def list_versions(
    name: Name, session: SessionDep, limit: Limit = 50, cursor: Cursor = None
) -> CursorPage[ModelVersionOut]:
    """The versions of a registered model, newest first."""
    _registered(session, name)
    before = None if cursor is None else cursors.decode(cursor, types=(int,))[0]
    rows = registry.list_versions(session, name=name, before_version=before, limit=limit + 1)
    page = rows[:limit]
    aliases: dict[int, list[str]] = {}
    for alias in registry.list_aliases(session, name=name):
        aliases.setdefault(alias.version, []).append(alias.alias)
    return CursorPage[ModelVersionOut](
        items=[_version_out(row, aliases.get(row.version, [])) for row in page],
        next_cursor=cursors.encode(page[-1].version) if len(rows) > limit else None,
    )


@router.get("/{name}/versions/{version}", response_model=ModelVersionOut)
def get_version(name: Name, version: Version, session: SessionDep) -> ModelVersionOut:
    """One version: its model and the aliases that point at it."""
    _registered(session, name)
    row = registry.get_version(session, name=name, version=version)
    if row is None:
        raise NotFoundError(f"registered model {name} has no version {version}")
    return _version_out(row, registry.aliases_of_version(session, name=name, version=version))


@router.get("/{name}/aliases/{alias}", response_model=AliasOut)
def get_alias(name: Name, alias: Alias, session: SessionDep) -> AliasOut:
    """Where an alias points."""
    _registered(session, name)
    row = registry.get_alias(session, name=name, alias=alias)
    if row is None:
        raise NotFoundError(f"registered model {name} has no alias '{alias[:140]}'")
    version = registry.get_version(session, name=name, version=row.version)
    assert version is not None  # foreign key
    return _alias_out(row, version.model_id)


@router.put(
    "/{name}/aliases/{alias}",
    response_model=AliasOut,
    responses={
        404: {"description": "no such registered model or version"},
        409: {"description": "the version was deleted while the alias was moving onto it"},
    },
)
def set_alias(
    name: Name,
    alias: Alias,
    target: Annotated[AliasIn, Body()],
    session: SessionDep,
    api_key: ApiKeyDep,
    resolver: ReferenceResolverDep,
) -> AliasOut:
    """Point an alias at a version, creating it or moving it atomically. This API process
    follows the move at once, every other within ``MIXREG_ALIAS_REFRESH_S`` seconds; the move
    is recorded (see ``GET /registered-models/{name}/alias-events``)."""
    model_references.check_name(alias, what="the alias")
    _registered(session, name)
    version = registry.get_version(session, name=name, version=target.version)
    if version is None:
        raise NotFoundError(f"registered model {name} has no version {target.version}")
    move = registry.set_alias(
        session,
        name=name,
        alias=alias,
        version=target.version,
        changed_by=api_key.id if api_key is not None else None,
    )
    if move is None:
        raise ConflictError(
            f"version {target.version} of {name} was deleted while {name}@{alias} was being "
            f"moved onto it; the alias was not moved"
        )
    resolver.forget_after_commit(session, f"{name}@{alias}")
    return _alias_out(move.alias, version.model_id, move.from_version)


@router.delete("/{name}/aliases/{alias}", status_code=204, response_class=Response)
def delete_alias(
    name: Name,
    alias: Alias,
    session: SessionDep,
    api_key: ApiKeyDep,
    resolver: ReferenceResolverDep,
) -> None:
    """Remove an alias (recorded in the audit trail)."""
    _registered(session, name)
    if not registry.delete_alias(
        session, name=name, alias=alias, changed_by=api_key.id if api_key is not None else None
    ):
        raise NotFoundError(f"registered model {name} has no alias '{alias[:140]}'")
    resolver.forget_after_commit(session, f"{name}@{alias}")


@router.get("/{name}/alias-events", response_model=CursorPage[AliasEventOut])
def alias_events(
    name: Name, session: SessionDep, limit: Limit = 50, cursor: Cursor = None
) -> CursorPage[AliasEventOut]:
    """The audit trail of the aliases: every move, newest first, with who made it and when."""
    _registered(session, name)
    before = None if cursor is None else cursors.decode(cursor, types=(int,))[0]
    rows = registry.alias_events(session, name=name, before_id=before, limit=limit + 1)
    page = rows[:limit]
    return CursorPage[AliasEventOut](
        items=[
            AliasEventOut(
                id=row.id,
                alias=row.alias,
                from_version=row.from_version,
                to_version=row.to_version,
                changed_by=row.changed_by,
                changed_at=row.changed_at,
            )
            for row in page
        ],
        next_cursor=cursors.encode(page[-1].id) if len(rows) > limit else None,
    )
