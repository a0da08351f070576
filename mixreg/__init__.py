"""mixreg: mixtures of k linear regressions with list-decoded predictions.

Implements the algorithms of Ghosh, Mazumdar, Pal and Sen, "On Learning Mixture of Linear
Regressions in the Non-Realizable Setting": gradient alternating minimization (Algorithm 1),
the sub-sample algorithms (Algorithms 2 and 3, with least-squares or RANSAC fits) and their
combination, plus classical AM and EM for a Gaussian mixture of regressions, and the default
``"auto"``, which polishes candidates from all of them by classical AM and keeps the best;
``select_n_components`` chooses k by BIC; ``fit_per_key`` fits a mixture per key (per account)
for many keys at once.
"""

from ._chunks import ArrayChunks, Chunk, ChunkSource, NpyChunks, write_npy_chunks
from ._dask import DaskArrayChunks, DaskChunks
from ._estimator import (
    MAX_ABS_Y,
    MAX_EXHAUSTIVE_PARTITIONS,
    DegenerateFitWarning,
    MixtureOfLinearRegressions,
    StandardErrorWarning,
    component_order,
    minimum_rows_per_line,
)
from ._inference import BootstrapResult
from ._keyed import (
    FAILURE_REASON,
    MAX_FAILURES_LISTED,
    STATUSES,
    KeyedMixture,
    UnknownKeyError,
    fit_per_key,
    key_array,
    missing_keys,
)
from ._loss import gate_probabilities, min_loss, predict_lines
from ._selection import (
    ComponentsFit,
    MixtureScore,
    NComponentsSelection,
    SweepLikelihoodWarning,
    check_n_components_list,
    likelihood_drops,
    mixture_score,
    preferred_n_components,
    select_n_components,
    sweep_warm_start,
)
from ._solvers import GROUPED_ALGORITHMS
from ._summary import InferenceSummary, SummaryRow
from ._validation import ALGORITHM_PARAMETERS, ALGORITHMS

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_PARAMETERS",
    "FAILURE_REASON",
    "GROUPED_ALGORITHMS",
    "MAX_ABS_Y",
    "MAX_EXHAUSTIVE_PARTITIONS",
    "MAX_FAILURES_LISTED",
    "STATUSES",
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
    "check_n_components_list",
    "component_order",
    "fit_per_key",
    "gate_probabilities",
    "key_array",
    "likelihood_drops",
    "min_loss",
    "minimum_rows_per_line",
    "missing_keys",
    "mixture_score",
    "predict_lines",
    "preferred_n_components",
    "select_n_components",
    "sweep_warm_start",
    "write_npy_chunks",
]
