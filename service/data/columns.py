"""The extra columns of a stored dataset that a request names: checked, then loaded.

A request field (``groups``, ``weights``, a gate's ``concomitants``, ...) names a column the
dataset kept at upload (option ``keep``, or JSON ``columns``); a name the dataset does not keep,
or a column of the wrong type, is a 422 naming the field and the column before anything is
queued. The fit process then loads the values in row order, the order of
``models_store.datasets.iter_dataset_blocks``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from numpy.typing import NDArray

from models_store import datasets as dataset_store
from models_store.tables import Dataset
from service.errors import InvalidInputError

NUMBER = "number"
STRING = "string"
ANY_TYPE: frozenset[str] = frozenset({NUMBER, STRING})
"""The types a column of ids (groups, keys) may have: numbers or text."""

_TYPE_WORDS = {NUMBER: "numbers", STRING: "text"}
_NEEDED = {NUMBER: "a number column", STRING: "a string column"}


def _listed(dataset: Dataset) -> str:
    columns = [f"{column['name']} ({column['type']})" for column in dataset.extra_columns]
    return ", ".join(columns) if columns else "none (keep columns at upload with keep=...)"


def check_columns(
    dataset: Dataset,
    wanted: Mapping[str, str],
    allowed_types: Mapping[str, Collection[str]] | None = None,
) -> dict[str, str]:
    """Check that ``dataset`` keeps each column ``wanted`` maps a request field to, of a type
    ``allowed_types`` allows for that field (any type when the field is not listed); return
    field -> the column's type.

    Raises ``InvalidInputError`` (422) naming the field and the column, e.g. "groups names the
    column 'user' which the dataset does not have; its extra columns are: ...".
    """
    types = {column["name"]: column["type"] for column in dataset.extra_columns}
    checked: dict[str, str] = {}
    for field, name in wanted.items():
        if name not in types:
            raise InvalidInputError(
                f"{field} names the column '{name[:100]}' which the dataset does not have; its "
                f"extra columns are: {_listed(dataset)}"
            )
        allowed = (allowed_types or {}).get(field, ANY_TYPE)
        if types[name] not in allowed:
            needed = " or ".join(_NEEDED[kind] for kind in sorted(allowed))
            raise InvalidInputError(
                f"{field} names '{name}' which holds {_TYPE_WORDS[types[name]]}; {needed} is needed"
            )
        checked[field] = types[name]
    return checked


def load_columns(dataset: Dataset, wanted: Mapping[str, str]) -> dict[str, NDArray[Any]]:
    """The values of the columns ``wanted`` maps request fields to, per field, over all the
    rows of ``dataset`` (read through its session) in row order: float64 (NaN where missing)
    for a number column, an object array of ``str`` (``None`` where missing) for a string one.

    Check the fields first with :func:`check_columns`; a column named twice is read once.
    """
    loaded = dataset_store.load_dataset_columns(dataset, list(dict.fromkeys(wanted.values())))
    return {field: loaded[name] for field, name in wanted.items()}
