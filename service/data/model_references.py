"""Model references: a model id, or a registered model's alias or version, parsed and
resolved in a session (the cache of what they resolved to is
:class:`service.serving.references.ReferenceResolver`).

Wherever a model id is accepted, so are

- ``name@alias``: the version the alias points at, e.g. ``recommender@production``;
- ``name/versions/N``: version N of the registered model ``name``;
- ``name``: its latest version.

Names and aliases are 1 to 128 letters, digits, ``_``, ``.`` or ``-``, starting with a letter or
digit; a name is never 32 lowercase hexadecimal digits (the form of a model id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy.orm import Session

from models_store import models as model_store
from models_store import registry
from models_store.tables import Model
from service.checks import MODEL_ID, NAME_PATTERN, name_error
from service.errors import InvalidInputError, NotFoundError

_REFERENCE = re.compile(
    rf"(?P<name>{NAME_PATTERN})(?:@(?P<alias>{NAME_PATTERN})|/versions/(?P<version>[0-9]{{1,9}}))?"
)


def check_name(value: str, *, what: str) -> str:
    """Return ``value`` if it is a valid registered model name (or alias); else raise
    ``InvalidInputError`` saying what a name may hold."""
    error = name_error(value, what=what)
    if error is not None:
        raise InvalidInputError(error)
    return value


@dataclass(frozen=True)
class ModelReference:
    """A parsed reference: a model id, or a registered name with an alias, a version or
    neither (its latest version)."""

    text: str
    model_id: str | None = None
    name: str | None = None
    alias: str | None = None
    version: int | None = None


def parse_reference(text: str) -> ModelReference:
    """Parse ``text``; a text of no accepted form names no model (404)."""
    if MODEL_ID.fullmatch(text):
        return ModelReference(text=text, model_id=text)
    match = _REFERENCE.fullmatch(text)
    if match is None or MODEL_ID.fullmatch(match["name"]):
        raise NotFoundError(f"model {text[:300]} does not exist")
    version = match["version"]
    return ModelReference(
        text=text,
        name=match["name"],
        alias=match["alias"],
        version=None if version is None else int(version),
    )


def is_reference_like(text: str) -> bool:
    """Whether ``text`` has the form of a reference (it may still name nothing)."""
    return MODEL_ID.fullmatch(text) is not None or _REFERENCE.fullmatch(text) is not None


def resolve_in_session(session: Session, reference: ModelReference) -> str:
    """The id of the model ``reference`` names, read in ``session``; 404 naming what is
    missing (no such model, registered model, alias or version)."""
    if reference.model_id is not None:
        return reference.model_id
    assert reference.name is not None
    name = reference.name
    if reference.alias is not None:
        alias = registry.get_alias(session, name=name, alias=reference.alias)
        if alias is None:
            raise NotFoundError(_missing(session, reference, f"has no alias '{reference.alias}'"))
        version = registry.get_version(session, name=name, version=alias.version)
    elif reference.version is not None:
        version = registry.get_version(session, name=name, version=reference.version)
        if version is None:
            raise NotFoundError(_missing(session, reference, f"has no version {reference.version}"))
    else:
        version = registry.latest_version(session, name=name)
        if version is None:
            raise NotFoundError(_missing(session, reference, "has no version yet"))
    assert version is not None  # an alias points at an existing version (foreign key)
    return version.model_id


def _missing(session: Session, reference: ModelReference, what: str) -> str:
    assert reference.name is not None
    if registry.get_registered_model(session, name=reference.name) is None:
        return f"model {reference.text} does not exist"
    return f"registered model {reference.name} {what}"


def get_model(session: Session, text: str) -> Model:
    """The model ``text`` names, read in ``session``; 404 if none."""
    model_id = resolve_in_session(session, parse_reference(text))
    model = model_store.get_model(session, model_id=model_id)
    if model is None:
        raise NotFoundError(f"model {text} does not exist")
    return model
