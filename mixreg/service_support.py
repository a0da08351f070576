"""Helpers that a service built on mixreg needs and a user of the estimator does not.

:mod:`mixreg` exports what fitting, choosing k, predicting and reading standard errors take
(see ``mixreg.__all__``). What a service needs besides, to check a request before it queues
a fit, to cut a keyed data set into shards, to store a keyed fit's per-key status and to run
a k sweep one fit at a time, lives here (docs/adr/0026-the-public-namespace.md):

- request checks: :func:`check_n_components_list` (a list of k to sweep), :data:`MAX_ABS_Y`
  (the largest target a fit accepts), :func:`minimum_rows_per_line`;
- keyed fits: :func:`key_array` and :func:`missing_keys` (keys as the keyed fit reads them),
  :data:`STATUSES` (the per-key status codes, by index), :data:`FAILURE_REASON` and
  :data:`MAX_FAILURES_LISTED` (what a stored keyed fit says about failed keys);
- k sweeps run step by step: :func:`sweep_warm_start`, :func:`likelihood_drops`,
  :func:`preferred_n_components`;
- :func:`component_order`, the documented order of fitted lines.

These names may change with the service; the names of ``mixreg.__all__`` are the stable ones.
"""

from ._estimator import component_order
from ._fit_warnings import minimum_rows_per_line
from ._keyed import FAILURE_REASON, MAX_FAILURES_LISTED, STATUSES, key_array, missing_keys
from ._scaling import MAX_ABS_Y
from ._selection import (
    check_n_components_list,
    likelihood_drops,
    preferred_n_components,
    sweep_warm_start,
)

__all__ = [
    "FAILURE_REASON",
    "MAX_ABS_Y",
    "MAX_FAILURES_LISTED",
    "STATUSES",
    "check_n_components_list",
    "component_order",
    "key_array",
    "likelihood_drops",
    "minimum_rows_per_line",
    "missing_keys",
    "preferred_n_components",
    "sweep_warm_start",
]
