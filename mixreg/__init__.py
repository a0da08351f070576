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
