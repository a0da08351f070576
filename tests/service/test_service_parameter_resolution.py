"""Resolving a fit's parameters at the service's limits is one pass of bounded cost, done in
the request's thread: every k from 1 to MIXREG_MAX_K, the most rows and features, the largest
sub-sample, answered in milliseconds (a refusal is a 422 naming what to change)."""

from __future__ import annotations

import time

import pytest

from mixreg._subsample import capped_stirling2, stirling2
from service.config import Settings
from service.errors import InvalidInputError
from service.jobs.fit_spec import FitSpec
from service.jobs.submit import check_fit

SETTINGS = Settings()
# Loosely, for a busy machine: each k takes milliseconds on an idle one.
BOUND_PER_K_S = 0.5


def exhaustive(k: int, subsample_size: int | None) -> FitSpec:
    return FitSpec(
        algorithm="subsample-exhaustive",
        n_components=k,
        params={} if subsample_size is None else {"subsample_size": subsample_size},
        fit_intercept=True,
        holdout_fraction=0.0,
        seed=0,
        time_budget_s=None,
    )


@pytest.mark.parametrize("subsample_size", [None, 150, SETTINGS.max_subsample_size])
def test_every_k_up_to_the_limit_resolves_in_bounded_time(subsample_size):
    slowest = 0.0
    outcomes = {}
    for k in range(1, SETTINGS.max_k + 1):
        started = time.perf_counter()
        try:
            params = check_fit(
                exhaustive(k, subsample_size),
                n_rows=SETTINGS.max_rows,
                n_features=SETTINGS.max_features,
            )
            outcomes[k] = params["subsample_size"]
        except InvalidInputError as exc:
            assert "subsample_size" in str(exc)
            outcomes[k] = None
        slowest = max(slowest, time.perf_counter() - started)
    assert slowest < BOUND_PER_K_S, slowest
    # One line: one partition whatever the size, so any size is accepted.
    if subsample_size is not None:
        assert outcomes[1] == subsample_size
    if subsample_size == SETTINGS.max_subsample_size:
        # More lines than one: far more partitions of 100,000 rows than the cap.
        assert all(outcomes[k] is None for k in range(2, SETTINGS.max_k + 1))


def test_a_k_sweep_at_the_limits_resolves_in_bounded_time():
    spec = exhaustive(SETTINGS.max_k, None)
    k_values = tuple(range(SETTINGS.max_k - SETTINGS.max_k_sweep + 1, SETTINGS.max_k + 1))
    sweep = FitSpec(**{**spec.__dict__, "k_values": k_values})
    started = time.perf_counter()
    check_fit(sweep, n_rows=SETTINGS.max_rows, n_features=SETTINGS.max_features)
    assert time.perf_counter() - started < BOUND_PER_K_S * len(k_values)


@pytest.mark.parametrize("n", [1, 2, 7, 100_000])
def test_one_part_has_one_partition_whatever_the_size(n):
    assert stirling2(n, 1) == 1
    assert capped_stirling2(n, 1, cap=10) == 1
