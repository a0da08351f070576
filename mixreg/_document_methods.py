"""The estimator's JSON documents: :meth:`to_dict` writes the fitted lines (and gate) as plain
numbers and names, never pickle; :meth:`from_dict` reads them back to the same predictions, bit
for bit (the document's format is :mod:`mixreg._document`'s).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._document import gate_document, lines_document, read_lines
from ._validation import PARAMETER_NAMES

FloatArray = NDArray[np.float64]


class DocumentMethods:
    """``to_dict`` and ``from_dict`` of a mixture (a base of the estimator)."""

    # What the methods read from and set on the estimator: its parameters, fitted attributes
    # and methods.
    fit_intercept: bool
    algorithm: str
    n_features_in_: int
    coef_: FloatArray
    intercept_: FloatArray
    shares_: FloatArray
    noise_variance_: FloatArray
    log_likelihood_: float
    bic_: float
    gate_coef_: FloatArray
    gate_intercept_: FloatArray
    gate_on_features_: bool
    n_concomitant_in_: int
    _check_fitted: Callable[[], None]
    get_params: Callable[..., dict[str, Any]]

    def to_dict(
        self,
        feature_names: Sequence[str] | None = None,
        concomitant_names: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The fitted lines as a JSON-ready document (plain numbers and names, never pickle)
        that :meth:`from_dict` reads back to the same predictions, bit for bit.

        Parameters
        ----------
        feature_names : sequence of str, optional
            One name per feature; default ``x0, x1, ...``.
        concomitant_names : sequence of str, optional
            One name per concomitant column of a gate fitted on ``concomitant``; default
            ``z0, z1, ...``.

        Returns
        -------
        document : dict
            ``format`` (``"mixreg-model"``), ``format_version``, ``n_components``,
            ``n_features``, ``feature_names``, ``fit_intercept``, ``coef`` (k lists of d
            numbers), ``intercept`` and ``shares`` (k numbers), ``gate`` (None without a gate;
            else ``concomitant`` — None when the gate reads the features, else the column
            names —, ``coef`` (k lists of q numbers), ``intercept``, ``noise_variance`` (k
            numbers), ``log_likelihood``, ``bic``), ``algorithm`` and ``params`` (the
            estimator's JSON-representable parameters).
        """
        self._check_fitted()
        gate = None
        if hasattr(self, "gate_coef_"):
            gate = gate_document(
                coef=self.gate_coef_,
                intercept=self.gate_intercept_,
                noise_variance=self.noise_variance_,
                log_likelihood=self.log_likelihood_,
                bic=self.bic_,
                concomitant_names=None
                if self.gate_on_features_
                else (
                    concomitant_names
                    if concomitant_names is not None
                    else [f"z{j}" for j in range(self.n_concomitant_in_)]
                ),
            )
        params = {
            name: value
            for name, value in self.get_params().items()
            if name not in ("n_components", "algorithm", "fit_intercept", "gating")
            and (value is None or isinstance(value, str | int | float | bool | np.ndarray | list))
        }
        return lines_document(
            coef=self.coef_,
            intercept=self.intercept_,
            shares=self.shares_,
            fit_intercept=bool(self.fit_intercept),
            feature_names=feature_names,
            algorithm=str(self.algorithm),
            params=params,
            gate=gate,
        )

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Any:
        """A fitted estimator with the lines of a :meth:`to_dict` document (members that the
        document may carry besides, such as a service's metrics, are ignored).

        Raises
        ------
        ValueError
            Naming what the document lacks or holds wrong.
        """
        lines = read_lines(document)
        params = {name: value for name, value in lines["params"].items() if name in PARAMETER_NAMES}
        # The estimator's class (this is one of its bases), with the estimator's parameters.
        make: Any = cls
        estimator = make(
            n_components=int(lines["coef"].shape[0]),
            algorithm=lines["algorithm"],
            fit_intercept=lines["fit_intercept"],
            random_state=lines["params"].get("random_state"),
            gating=lines["gate"] is not None,
            **params,
        )
        estimator.coef_ = lines["coef"]
        estimator.intercept_ = lines["intercept"]
        estimator.shares_ = lines["shares"]
        estimator.n_features_in_ = int(lines["coef"].shape[1])
        gate = lines["gate"]
        if gate is not None:
            estimator.gate_coef_ = gate["coef"]
            estimator.gate_intercept_ = gate["intercept"]
            estimator.noise_variance_ = gate["noise_variance"]
            estimator.log_likelihood_ = gate["log_likelihood"]
            estimator.bic_ = gate["bic"]
            estimator.gate_on_features_ = gate["concomitant"] is None
            estimator.n_concomitant_in_ = int(gate["coef"].shape[1])
        return estimator
