"""Whether the tests run in continuous integration, where every service they use must be up."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import pytest

# CI systems set CI to "true", "True" or "1", depending on the system; the usual spellings of a
# true boolean are all accepted, and anything else (unset, empty, "0", "false") means no CI.
TRUTHY = frozenset({"1", "true", "yes", "on"})


def running_in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """True if ``CI`` is 1, true, yes or on, in any letter case (``os.environ`` by default)."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() in TRUTHY


def service_unavailable(message: str) -> NoReturn:
    """Fail the test in CI, where the service is part of the environment; skip it elsewhere."""
    if running_in_ci():
        pytest.fail(message)
    pytest.skip(message)
