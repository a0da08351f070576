"""mixreg: mixtures of k linear regressions with list-decoded predictions.

Implements the algorithms of Ghosh, Mazumdar, Pal and Sen, "On Learning Mixture of Linear
Regressions in the Non-Realizable Setting": gradient alternating minimization (Algorithm 1),
the sub-sample algorithms (Algorithms 2 and 3, with least-squares or RANSAC fits) and their
combination, plus classical AM and EM for a Gaussian mixture of regressions, and the default
``"auto"``, which polishes candidates from all of them by classical AM and keeps the best;
``select_n_components`` chooses k by BIC; ``fit_per_key`` fits a mixture per key (per account)
for many keys at once.

``__all__`` holds what a user of the estimator needs: the estimators, their results and
warnings, the algorithms and their parameters, and the functions that predict or score with
fitted lines. Helpers that only a service needs (request checks, keyed-fit status codes, the
steps of a k sweep) live in :mod:`mixreg.service_support` (docs/adr/0026).
"""

from typing import TYPE_CHECKING, Any

from . import service_support
from ._bootstrap import BootstrapResult
from ._chunks import ArrayChunks, Chunk, ChunkSource, NpyChunks, write_npy_chunks
from ._dask import DaskArrayChunks, DaskChunks
from ._estimator import MixtureOfLinearRegressions
from ._fit_warnings import DegenerateFitWarning
from ._keyed import KeyedMixture, UnknownKeyError, fit_per_key
from ._loss import gate_probabilities, min_loss, predict_lines
from ._selection import (
    ComponentsFit,
    MixtureScore,
    NComponentsSelection,
    SweepLikelihoodWarning,
    mixture_score,
    select_n_components,
)
from ._solvers import GROUPED_ALGORITHMS
from ._standard_errors import StandardErrorWarning
from ._subsample import MAX_EXHAUSTIVE_PARTITIONS
from ._summary import InferenceSummary, SummaryRow
from ._validation import ALGORITHM_PARAMETERS, ALGORITHMS

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_PARAMETERS",
    "GROUPED_ALGORITHMS",
    "MAX_EXHAUSTIVE_PARTITIONS",
    "ArrayChunks",
    "BootstrapResult",
    "Chunk",
    "ChunkSource",
    "ComponentsFit",
    "DaskArrayChunks",
    "DaskChunks",
    "DegenerateFitWarning",
    "InferenceSummary",
    "KeyedMixture",
    "MixtureOfLinearRegressions",
    "MixtureScore",
    "NComponentsSelection",
    "NpyChunks",
    "StandardErrorWarning",
    "SummaryRow",
    "SweepLikelihoodWarning",
    "UnknownKeyError",
    "fit_per_key",
    "gate_probabilities",
    "min_loss",
    "mixture_score",
    "predict_lines",
    "select_n_components",
    "write_npy_chunks",
]

# Until service/jobs/training.py and service/schemas.py (being split at the same time) import
# these from mixreg.service_support, ``mixreg.NAME`` still finds them; they are in no
# ``__all__`` of this package. Delete this forwarding once nothing in service/ uses it
# (tests/mixreg/test_public_namespace.py lists the modules that still do).
_FORWARDED_TO_SERVICE_SUPPORT = frozenset(service_support.__all__)

if TYPE_CHECKING:
    # The forwarded names, typed for the type checker (at run time __getattr__ finds them).
    from .service_support import FAILURE_REASON as FAILURE_REASON
    from .service_support import MAX_ABS_Y as MAX_ABS_Y
    from .service_support import MAX_FAILURES_LISTED as MAX_FAILURES_LISTED
    from .service_support import STATUSES as STATUSES
    from .service_support import check_n_components_list as check_n_components_list
    from .service_support import component_order as component_order
    from .service_support import key_array as key_array
    from .service_support import likelihood_drops as likelihood_drops
    from .service_support import minimum_rows_per_line as minimum_rows_per_line
    from .service_support import missing_keys as missing_keys
    from .service_support import preferred_n_components as preferred_n_components
    from .service_support import sweep_warm_start as sweep_warm_start


def __getattr__(name: str) -> Any:
    if name in _FORWARDED_TO_SERVICE_SUPPORT:
        return getattr(service_support, name)
    raise AttributeError(f"module 'mixreg' has no attribute {name!r}")
