"""mixreg: mixtures of k linear regressions with list-decoded predictions.

Implements the algorithms of Ghosh, Mazumdar, Pal and Sen, "On Learning Mixture of Linear
Regressions in the Non-Realizable Setting": gradient alternating minimization (Algorithm 1),
the sub-sample algorithms (Algorithms 2 and 3, with least-squares or RANSAC fits) and their
combination, plus classical AM and EM for a Gaussian mixture of regressions, and the default
``"auto"``, which polishes candidates from all of them by classical AM and keeps the best;
``select_n_components`` chooses k by BIC.
"""

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
from ._loss import gate_probabilities, min_loss, predict_lines
from ._selection import (
    ComponentsFit,
    MixtureScore,
    NComponentsSelection,
    check_n_components_list,
    mixture_score,
    nested_scores,
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
    "GROUPED_ALGORITHMS",
    "MAX_ABS_Y",
    "MAX_EXHAUSTIVE_PARTITIONS",
    "BootstrapResult",
    "ComponentsFit",
    "DegenerateFitWarning",
    "InferenceSummary",
    "MixtureOfLinearRegressions",
    "MixtureScore",
    "NComponentsSelection",
    "StandardErrorWarning",
    "SummaryRow",
    "check_n_components_list",
    "component_order",
    "gate_probabilities",
    "min_loss",
    "minimum_rows_per_line",
    "mixture_score",
    "nested_scores",
    "predict_lines",
    "preferred_n_components",
    "select_n_components",
    "sweep_warm_start",
]
