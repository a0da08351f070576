"""Registered models over real HTTP with two API processes on one database: an alias moved
back and forth under load is followed by both processes within the bounded delay, with no
failed and no mixed answer; Triton's client addresses versions and aliases."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import onnxruntime
import pytest
import tritonclient.http as triton

from mixreg_client import Client

from .conftest import Server, ServerFactory, mixture_data
from .test_e2e_cli import mixreg

pytestmark = pytest.mark.e2e

REFRESH_S = 0.5
# What a loaded machine may add to the refresh delay: a lookup, a thread hop, scheduling.
SLACK_S = 0.5


def fit_version(server: Server, *, seed: int, shift: float) -> str:
    """Fit a new version of ``reco`` on data shifted by ``shift``; return its model id."""
    X, y = mixture_data(n_rows=120, seed=seed)
    job = server.wait_for_job(
        server.fit(
            {
                "data": {"X": X.tolist(), "y": (y + shift).tolist()},
                "k": 2,
                "algorithm": "am-classic",
                "seed": seed,
                "registered_model": "reco",
            }
        )
    )
    assert job["status"] == "succeeded", job
    return str(job["model_id"])


@dataclass(frozen=True)
class Answer:
    server: int
    sent: float
    received: float
    status: int
    model_id: str | None
    version: int | None
    predictions: list[list[float]] | None


@dataclass(frozen=True)
class Move:
    started: float
    finished: float
    version: int


def hammer(
    server: Server, index: int, row: list[list[float]], stop: threading.Event, answers: list[Answer]
) -> None:
    """Predict ``row`` by ``reco@production`` until ``stop``, recording every answer."""
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                response = client.post("/predict", json={"model_id": "reco@production", "X": row})
            except httpx.TransportError:
                answers.append(Answer(index, sent, time.monotonic(), 0, None, None, None))
                continue
            received = time.monotonic()
            body: dict[str, Any] = response.json() if response.status_code == 200 else {}
            answers.append(
                Answer(
                    index,
                    sent,
                    received,
                    response.status_code,
                    body.get("model_id"),
                    body.get("version"),
                    body.get("predictions"),
                )
            )


def allowed_versions(answer: Answer, moves: list[Move]) -> set[int]:
    """The versions the alias held at some moment of ``[sent - delay, received]``, a move
    taking effect anywhere within its PUT request."""
    start = answer.sent - REFRESH_S - SLACK_S
    allowed = set()
    for current, following in zip(moves, [*moves[1:], None], strict=True):
        held_from = current.started
        held_until = following.finished if following is not None else float("inf")
        if held_from <= answer.received and held_until >= start:
            allowed.add(current.version)
    return allowed


def test_an_alias_moved_under_load_switches_both_processes_without_a_failed_or_mixed_answer(
    make_server: ServerFactory,
):
    settings = {"MIXREG_ALIAS_REFRESH_S": str(REFRESH_S)}
    first = make_server(**settings)
    second = make_server(MIXREG_EMBEDDED_WORKER="false", **settings)
    model_ids = {
        1: fit_version(first, seed=1, shift=0.0),
        2: fit_version(first, seed=2, shift=50.0),
    }
    row = mixture_data(n_rows=1, seed=9)[0].tolist()
    expected = {
        version: first.request("POST", f"/models/{model_id}/predict", json={"X": row}).json()[
            "predictions"
        ]
        for version, model_id in model_ids.items()
    }
    assert expected[1] != expected[2]

    def move(version: int) -> Move:
        started = time.monotonic()
        response = second.request(
            "PUT", "/registered-models/reco/aliases/production", json={"version": version}
        )
        assert response.status_code == 200, response.text
        return Move(started, time.monotonic(), version)

    moves = [move(1)]
    stop = threading.Event()
    answers: list[Answer] = []
    threads = [
        threading.Thread(target=hammer, args=(server, index, row, stop, answers))
        for index, server in enumerate((first, second, first, second))
    ]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.5)
        moves.append(move(2))
        time.sleep(2.5)
        moves.append(move(1))
        time.sleep(2.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    assert len(answers) > 100
    assert [answer for answer in answers if answer.status != 200] == []
    for answer in answers:
        assert answer.version in (1, 2)
        # Wholly one version: its id, its number and its predictions agree.
        assert answer.model_id == model_ids[answer.version]
        assert answer.predictions == expected[answer.version]
        assert answer.version in allowed_versions(answer, moves), (answer, moves)
    for index in (0, 1):
        served = [answer for answer in answers if answer.server == index]
        for move_at, version in ((moves[1], 2), (moves[2], 1)):
            settled = move_at.finished + REFRESH_S + SLACK_S
            window = [a for a in served if settled <= a.sent < settled + 1.0]
            assert window and {a.version for a in window} == {version}, (index, version)
    events = first.request("GET", "/registered-models/reco/alias-events").json()["items"]
    assert [(e["from_version"], e["to_version"]) for e in events] == [(2, 1), (1, 2), (None, 1)]


def test_the_triton_client_addresses_versions_and_aliases(make_server: ServerFactory):
    server = make_server(MIXREG_ALIAS_REFRESH_S="0.2")
    model_ids = {
        1: fit_version(server, seed=1, shift=0.0),
        2: fit_version(server, seed=2, shift=5.0),
    }
    response = server.request(
        "PUT", "/registered-models/reco/aliases/production", json={"version": 1}
    )
    assert response.status_code == 200, response.text
    X, _ = mixture_data(n_rows=10, seed=4)
    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        assert client.is_model_ready("reco", model_version="2")
        assert not client.is_model_ready("reco", model_version="3")
        assert client.get_model_metadata("reco")["versions"] == ["1", "2"]
        for name, version, answered in (
            ("reco", "1", "1"),
            ("reco", "2", "2"),
            ("reco", "", "2"),
            ("reco@production", "", "1"),
        ):
            tensor = triton.InferInput("X", list(X.shape), "FP64")
            tensor.set_data_from_numpy(X)
            result = client.infer(name, [tensor], model_version=version)
            assert result.get_response()["model_version"] == answered
            rest = server.request(
                "POST", f"/models/{model_ids[int(answered)]}/predict", json={"X": X.tolist()}
            )
            np.testing.assert_array_equal(
                result.as_numpy("predictions"), np.array(rest.json()["predictions"])
            )
    finally:
        client.close()


def test_the_daily_retrain_with_the_client_and_the_console_script(
    make_server: ServerFactory, tmp_path
):
    """Fit v1 and v2, serve v1 as production, warm-start today's fit from v2, promote, roll
    back: the README's recipe."""
    server = make_server(MIXREG_ALIAS_REFRESH_S="0.1")
    X, y = mixture_data(n_rows=300, seed=5)
    X_new, y_new = mixture_data(n_rows=300, seed=6)
    with Client(server.base_url) as client:
        stored = client.upload(X, y)
        for seed in (1, 2):
            client.fit(
                stored, k=2, algorithm="am-classic", seed=seed, registered_model="reco"
            ).wait(timeout=120)
        assert client.get_registered_model("reco").latest_version == 2
        assert client.set_alias("reco", "production", 1).previous_version is None
        v1 = client.get_model("reco/versions/1")
        np.testing.assert_array_equal(
            client.predict("reco@production", X_new[:5]), client.predict(v1, X_new[:5])
        )

        today = client.upload(X_new, y_new)
        cold = client.fit(today, k=2, algorithm="am-classic", seed=7).wait(timeout=120)
        warm = client.fit(
            today,
            k=2,
            algorithm="am-classic",
            seed=7,
            init_model="reco/versions/2",
            registered_model="reco",
        ).wait(timeout=120)
        assert warm.status == cold.status == "succeeded"
        cold_model, warm_model = client.get_model(cold.model_id), client.get_model(warm.model_id)
        assert warm_model.raw["n_iter"] < cold_model.raw["n_iter"]
        assert (warm_model.registered_model, warm_model.version) == ("reco", 3)
        assert [version.version for version in client.list_versions("reco")] == [3, 2, 1]

    url = server.base_url
    promoted = mixreg("alias", "reco", "production", "3", url=url)
    assert promoted.returncode == 0, promoted.stderr
    assert promoted.stdout.strip() == (
        f"reco@production -> version 3 (model {warm.model_id}; was version 1)"
    )
    rows = tmp_path / "rows.csv"
    np.savetxt(rows, X_new[:3], delimiter=",", header="x0,x1,x2", comments="")
    time.sleep(0.3)
    predicted = mixreg("predict", "reco@production", str(rows), url=url)
    assert predicted.returncode == 0, predicted.stderr
    with Client(url) as client:
        expected = client.predict(warm.model_id, X_new[:3])
    printed = np.loadtxt(predicted.stdout.splitlines()[1:], delimiter=",")
    np.testing.assert_allclose(printed, expected, rtol=1e-6)
    rolled_back = mixreg("alias", "reco", "production", "1", url=url)
    assert "-> version 1" in rolled_back.stdout and "was version 3" in rolled_back.stdout
    shown = mixreg("alias", "reco", "production", url=url)
    assert shown.stdout.startswith("reco@production -> version 1 ")
    missing = mixreg("alias", "reco", "production", "9", url=url)
    assert missing.returncode != 0
    assert "registered model reco has no version 9" in missing.stderr


def test_an_export_imported_by_another_server_and_its_onnx_graph_predict_the_same(
    make_server: ServerFactory, make_sqlite_server: ServerFactory
):
    source, target = make_server(), make_sqlite_server()
    model_id = fit_version(source, seed=3, shift=1.0)
    X, _ = mixture_data(n_rows=40, seed=8)
    X = X * [1e3, 1.0, 1e-3]
    expected = np.array(
        source.request("POST", f"/models/{model_id}/predict", json={"X": X.tolist()}).json()[
            "predictions"
        ]
    )
    exported = source.request("GET", "/models/reco/versions/1/export")
    assert exported.status_code == 200, exported.text
    imported = target.request(
        "POST", "/models/import", params={"registered_model": "reco"}, json=exported.json()
    )
    assert imported.status_code == 201, imported.text
    again = target.request("POST", "/models/reco/versions/1/predict", json={"X": X.tolist()})
    np.testing.assert_array_equal(np.array(again.json()["predictions"]), expected)
    for dtype, rtol in (("float64", 1e-12), ("float32", 1e-6)):
        graph = target.request("GET", "/models/reco/model.onnx", params={"dtype": dtype})
        assert graph.status_code == 200, graph.text
        session = onnxruntime.InferenceSession(graph.content, providers=["CPUExecutionProvider"])
        (predicted,) = session.run(None, {"X": X.astype(dtype)})
        reference = np.array(
            target.request(
                "POST", "/models/reco/predict", json={"X": X.astype(dtype).astype(float).tolist()}
            ).json()["predictions"]
        )
        np.testing.assert_allclose(
            predicted, reference, rtol=rtol, atol=rtol * np.abs(reference).max()
        )
