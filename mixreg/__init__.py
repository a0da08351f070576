"""mixreg: mixtures of k linear regressions with list-decoded predictions.

Implements the algorithms of Ghosh, Mazumdar, Pal and Sen, "On Learning Mixture of Linear
Regressions in the Non-Realizable Setting": gradient alternating minimization (Algorithm 1),
the sub-sample algorithms (Algorithms 2 and 3, with least-squares or RANSAC fits) and their
combination, plus classical AM and EM for a Gaussian mixture of regressions.
"""

from ._estimator import MAX_ABS_Y, MAX_EXHAUSTIVE_PARTITIONS, MixtureOfLinearRegressions
from ._loss import min_loss, predict_lines
from ._validation import ALGORITHM_PARAMETERS, ALGORITHMS

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_PARAMETERS",
    "MAX_ABS_Y",
    "MAX_EXHAUSTIVE_PARTITIONS",
    "MixtureOfLinearRegressions",
    "min_loss",
    "predict_lines",
]
