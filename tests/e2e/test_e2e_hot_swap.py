"""Hot swaps under load over real HTTP: four clients predict by ``reco@production`` (through
``POST /predict``, ``POST /models/{ref}/predict`` and the Open Inference Protocol) while the
alias moves ten times and each old version is deleted right after its move — not one answer
fails or mixes two versions. (``python -m bench.hostile_hotswap`` runs it longer, over two API
processes; tests/service/test_service_hot_swap.py covers a delete made by another process.)"""

from __future__ import annotations

import httpx
import pytest

from bench.hostile_hotswap import prepare_versions, run_hot_swaps

from .conftest import ServerFactory

pytestmark = pytest.mark.e2e

MOVES = 10


def test_four_clients_by_alias_see_no_failure_while_it_moves_and_old_versions_go(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        model_ids = prepare_versions(client, MOVES + 1)

    outcome = run_hot_swaps([server.base_url], model_ids, clients=4, interval_s=0.25)

    assert outcome.failures == []
    assert (outcome.not_ok, outcome.wrong) == (0, [])
    assert outcome.ok > 100
    assert (outcome.move_statuses, outcome.delete_statuses) == ({200: MOVES}, {204: MOVES})
    # The clients were answered by the versions in turn, the last one at the end.
    assert len(outcome.versions) >= 4 and MOVES + 1 in outcome.versions
    versions = server.request("GET", "/registered-models/reco/versions").json()["items"]
    assert [item["version"] for item in versions] == [MOVES + 1]
