"""The JSON document of a fitted mixture: plain numbers and names, never pickle.

``MixtureOfLinearRegressions.to_dict`` writes it and ``from_dict`` reads it back; a service may
add members of its own (metrics, provenance), which ``from_dict`` ignores.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._validation import ALGORITHMS

FORMAT = "mixreg-model"
FORMAT_VERSION = 1

FloatArray = NDArray[np.float64]


def _numbers(values: FloatArray) -> Any:
    # float() of a float64 is exact, and JSON writers print the shortest repr that reads back
    # to the same double: the lines survive a round trip bit for bit.
    return values.tolist()


def lines_document(
    *,
    coef: FloatArray,
    intercept: FloatArray,
    shares: FloatArray,
    fit_intercept: bool,
    feature_names: Sequence[str] | None,
    algorithm: str,
    params: Mapping[str, Any],
    gate: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The document of ``k`` fitted lines (``coef`` of shape (k, d)) and how they were fitted,
    with the gate's document (:func:`gate_document`) when the mixing probabilities have one."""
    n_components, n_features = coef.shape
    names = list(feature_names) if feature_names is not None else None
    if names is None:
        names = [f"x{j}" for j in range(n_features)]
    if len(names) != n_features:
        raise ValueError(f"got {len(names)} feature names for {n_features} features")
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "n_components": int(n_components),
        "n_features": int(n_features),
        "feature_names": names,
        "fit_intercept": bool(fit_intercept),
        "coef": _numbers(coef),
        "intercept": _numbers(intercept),
        "shares": _numbers(shares),
        "gate": None if gate is None else dict(gate),
        "algorithm": algorithm,
        "params": {name: _plain(value) for name, value in params.items()},
    }


def gate_document(
    *,
    coef: FloatArray,
    intercept: FloatArray,
    noise_variance: FloatArray,
    log_likelihood: float,
    bic: float,
    concomitant_names: Sequence[str] | None,
) -> dict[str, Any]:
    """The gate of a gated mixture: ``coef`` (k, q) and ``intercept`` (k,) of the multinomial
    logit on the concomitant columns (``concomitant_names``; None when it reads the features),
    each line's noise variance, and the fit's log-likelihood and BIC."""
    n_columns = coef.shape[1]
    names = None if concomitant_names is None else list(concomitant_names)
    if names is not None and len(names) != n_columns:
        raise ValueError(f"got {len(names)} concomitant names for a gate on {n_columns} columns")
    return {
        "concomitant": names,
        "coef": _numbers(coef),
        "intercept": _numbers(intercept),
        "noise_variance": _numbers(noise_variance),
        "log_likelihood": float(log_likelihood),
        "bic": float(bic),
    }


def _read_gate(gate: Any, k: int, d: int) -> dict[str, Any]:
    if not isinstance(gate, Mapping):
        raise ValueError("the model document's 'gate' must be an object or null")
    names = gate.get("concomitant")
    if names is None:
        n_columns = d
    elif isinstance(names, list) and names and all(isinstance(name, str) for name in names):
        n_columns = len(names)
    else:
        raise ValueError(
            "the model document's 'gate.concomitant' must be null (the features) or a list of "
            "column names"
        )
    variances = _finite_array(_member(gate, "noise_variance"), "gate.noise_variance", (k,))
    if (variances <= 0).any():
        raise ValueError("the model document's 'gate.noise_variance' must be positive")
    scores = {}
    for name in ("log_likelihood", "bic"):
        value = _member(gate, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"the model document's 'gate.{name}' must be a number")
        scores[name] = float(value)
    return {
        "concomitant": names,
        "coef": _finite_array(_member(gate, "coef"), "gate.coef", (k, n_columns)),
        "intercept": _finite_array(_member(gate, "intercept"), "gate.intercept", (k,)),
        "noise_variance": variances,
        **scores,
    }


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _member(document: Mapping[str, Any], name: str) -> Any:
    if name not in document:
        raise ValueError(f"the model document has no '{name}'")
    return document[name]


def _finite_array(value: Any, name: str, shape: tuple[int, ...]) -> FloatArray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"the model document's '{name}' must hold numbers") from None
    if array.shape != shape:
        raise ValueError(
            f"the model document's '{name}' must have shape {shape}, got {array.shape}"
        )
    if not np.isfinite(array).all():
        raise ValueError(f"the model document's '{name}' must hold finite numbers")
    return array


def _count(document: Mapping[str, Any], name: str) -> int:
    value = _member(document, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"the model document's '{name}' must be a positive integer, got {value!r}")
    return int(value)


def read_lines(document: Mapping[str, Any]) -> dict[str, Any]:
    """The checked contents of a model document: ``coef`` (k, d), ``intercept`` and
    ``shares`` (k,), ``fit_intercept``, ``feature_names``, ``algorithm``, ``params`` and
    ``gate`` (None, or the checked gate: ``concomitant``, ``coef`` (k, q), ``intercept`` and
    ``noise_variance`` (k,), ``log_likelihood``, ``bic``).

    Raises ``ValueError`` naming what is missing or wrong.
    """
    if not isinstance(document, Mapping):
        raise ValueError("a model document is a JSON object")
    if document.get("format") != FORMAT:
        raise ValueError(
            f"not a model document: its 'format' is {document.get('format')!r}, not {FORMAT!r}"
        )
    if document.get("keyed") is not None:
        # A keyed model's document carries only its global model: reading it as one mixture
        # would silently drop every key's lines.
        raise ValueError(
            "the model document is a keyed model's ('keyed' names its key column); its keys' "
            "lines travel beside it in the export archive, and one mixture cannot hold them"
        )
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"model documents of format_version {version!r} cannot be read; this version reads "
            f"{FORMAT_VERSION}"
        )
    k, d = _count(document, "n_components"), _count(document, "n_features")
    fit_intercept = _member(document, "fit_intercept")
    if not isinstance(fit_intercept, bool):
        raise ValueError("the model document's 'fit_intercept' must be true or false")
    names = _member(document, "feature_names")
    if (
        not isinstance(names, list)
        or len(names) != d
        or not all(isinstance(name, str) for name in names)
    ):
        raise ValueError(f"the model document's 'feature_names' must be {d} names")
    shares = _finite_array(_member(document, "shares"), "shares", (k,))
    if (shares < 0).any() or not math.isclose(float(shares.sum()), 1.0, abs_tol=1e-9):
        raise ValueError("the model document's 'shares' must be fractions that add up to 1")
    params = document.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError("the model document's 'params' must be an object")
    algorithm = document.get("algorithm", "auto")
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"the model document's 'algorithm' must be one of {', '.join(ALGORITHMS)}")
    return {
        "coef": _finite_array(_member(document, "coef"), "coef", (k, d)),
        "intercept": _finite_array(_member(document, "intercept"), "intercept", (k,)),
        "shares": shares,
        "fit_intercept": fit_intercept,
        "feature_names": list(names),
        "algorithm": algorithm,
        "params": dict(params),
        "gate": None if document.get("gate") is None else _read_gate(document["gate"], k, d),
    }
