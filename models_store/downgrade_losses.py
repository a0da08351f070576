"""What a schema downgrade would lose, counted before it runs.

Some revisions cannot be undone without loss: their downgrade deletes rows that the older
schema cannot hold (models whose dataset is gone, the registry), or drops what made a model
what it is (a keyed model's per-key lines, a gate, standard errors). ``mixreg db downgrade``
lists these counts and refuses to go on without ``--yes``.
"""

from __future__ import annotations

from collections.abc import Iterator

import sqlalchemy as sa
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from models_store.session import make_engine


def _has(column: str) -> str:
    """SQL: the JSON ``column`` holds a value (neither SQL NULL nor JSON ``null``)."""
    return f"({column} IS NOT NULL AND CAST({column} AS TEXT) <> 'null')"


_LATER_DUPLICATE = (
    "idempotency_key IS NOT NULL AND EXISTS (SELECT 1 FROM {table} AS earlier "
    "WHERE earlier.idempotency_key = {table}.idempotency_key "
    "AND (earlier.created_at < {table}.created_at OR "
    "(earlier.created_at = {table}.created_at AND earlier.id < {table}.id)))"
)

LOSSES: dict[str, tuple[tuple[str, str], ...]] = {
    "0032": (
        ("SELECT count(*) FROM prediction_log", "{n} logged prediction row(s) are deleted"),
        ("SELECT count(*) FROM prediction_outcomes", "{n} outcome(s) are deleted"),
        (
            "SELECT count(*) FROM prediction_log_settings",
            "{n} prediction log sampling setting(s) are deleted",
        ),
    ),
    "0012": (
        (
            "SELECT count(*) FROM models WHERE split_by IS NOT NULL",
            "{n} keyed model(s) become plain models: only their global lines remain",
        ),
        (
            "SELECT coalesce(sum(n_keys), 0) FROM keyed_model_chunks",
            "the lines of {n} key(s) of keyed models are deleted",
        ),
        (
            "SELECT count(*) FROM jobs WHERE split_by IS NOT NULL",
            "{n} keyed job(s) lose their key column",
        ),
    ),
    "0011": (
        (
            f"SELECT count(*) FROM models WHERE {_has('uncertainty')}",
            "{n} model(s) lose their standard errors",
        ),
    ),
    "0010": (
        (
            f"SELECT count(*) FROM models WHERE {_has('gate')}",
            "{n} gated model(s) lose their gate and become plain mixtures",
        ),
    ),
    "0009": (
        (
            "SELECT count(*) FROM models WHERE groups_column IS NOT NULL "
            "OR weights_column IS NOT NULL",
            "{n} grouped or weighted model(s) lose their group table and columns",
        ),
    ),
    "0008": (
        (
            "SELECT count(DISTINCT dataset_id) FROM dataset_chunks WHERE extra_data IS NOT NULL",
            "{n} dataset(s) lose their kept (extra) columns",
        ),
    ),
    "0007": (
        (
            "SELECT count(*) FROM models WHERE dataset_id NOT IN (SELECT id FROM datasets)",
            "{n} model(s) whose dataset is gone (imported, fitted without keeping their "
            "data, or of a deleted dataset) are deleted",
        ),
        (
            "SELECT count(*) FROM jobs WHERE dataset_id NOT IN (SELECT id FROM datasets)",
            "{n} job(s) whose dataset is gone are deleted",
        ),
        ("SELECT count(*) FROM registered_models", "{n} registered model name(s) are deleted"),
        ("SELECT count(*) FROM model_versions", "{n} model version(s) are deleted"),
        ("SELECT count(*) FROM model_aliases", "{n} alias(es) are deleted"),
        ("SELECT count(*) FROM model_alias_events", "{n} alias event(s) are deleted"),
    ),
    "0006": tuple(
        (
            f"SELECT count(*) FROM {table} WHERE " + _LATER_DUPLICATE.format(table=table),
            f"{{n}} {table[:-1]} idempotency key(s) that only their caller told apart are cleared",
        )
        for table in ("jobs", "datasets")
    ),
    "0001": (
        ("SELECT count(*) FROM datasets", "{n} dataset(s) are deleted"),
        ("SELECT count(*) FROM jobs", "{n} job(s) are deleted"),
        ("SELECT count(*) FROM models", "{n} model(s) are deleted"),
    ),
}
"""Per revision, what undoing it loses: a count query and what the count is of. Each query
reads only what its revision (or an older one) made, so it runs at any later revision."""


def _undone(script: ScriptDirectory, current: str, target: str) -> Iterator[str]:
    """The revisions a downgrade from ``current`` to ``target`` undoes, newest first; none
    when ``target`` is not below ``current`` (Alembic then refuses the downgrade itself)."""
    if target == "base":
        stop: str | None = None
    elif target.startswith("-") and target[1:].isdigit():
        steps, stop = int(target[1:]), current
        for _ in range(steps):
            if stop is None:
                return
            down = script.get_revision(stop).down_revision
            stop = down if isinstance(down, str) or down is None else None
    else:
        try:
            found = script.get_revision(target)
        except CommandError:
            return
        if found is None:
            return
        stop = found.revision
    undone: list[str] = []
    revision: str | None = current
    while revision is not None and revision != stop:
        undone.append(revision)
        down = script.get_revision(revision).down_revision
        revision = down if isinstance(down, str) else None
    if revision == stop:
        yield from undone


def downgrade_losses(
    url: str, script: ScriptDirectory, current: str | None, target: str
) -> list[str]:
    """What downgrading the database at ``url`` from ``current`` to ``target`` deletes or
    drops, one line per kind with its count; empty when it loses nothing."""
    if current is None:
        return []
    checks = [
        check for revision in _undone(script, current, target) for check in LOSSES.get(revision, ())
    ]
    if not checks:
        return []
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            counts = [(int(connection.scalar(sa.text(query)) or 0), text) for query, text in checks]
    finally:
        engine.dispose()
    return [text.format(n=count) for count, text in counts if count]
