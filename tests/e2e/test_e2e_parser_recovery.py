"""The child processes that parse big JSON bodies recover from a crash: killed with SIGKILL
(as the kernel's OOM killer does), they are started again, ``/readyz`` says so meanwhile, the
request whose child died is a 503 with ``Retry-After``, and the next upload is stored."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import Server, ServerFactory

pytestmark = pytest.mark.e2e


def descendants(pid: int, *, min_depth: int) -> set[int]:
    """The processes at least ``min_depth`` levels below ``pid``."""
    found: set[int] = set()
    frontier = [(pid, 0)]
    while frontier:
        parent, depth = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except FileNotFoundError:
                continue
            for child in map(int, children):
                if depth + 1 >= min_depth:
                    found.add(child)
                frontier.append((child, depth + 1))
    return found


def parser_children(server: Server) -> set[int]:
    # No fit runs in these tests, so the fork server's children (two levels below the server)
    # are the parsing processes.
    assert server.process is not None
    return descendants(server.process.pid, min_depth=2)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def json_dataset(n_rows: int, seed: int) -> bytes:
    X = np.random.default_rng(seed).standard_normal((n_rows, 3))
    return json.dumps({"X": X.tolist(), "y": X[:, 0].tolist()}).encode()


def upload(server: Server, body: bytes) -> httpx.Response:
    return server.request(
        "POST", "/datasets", content=body, headers={"content-type": "application/json"}
    )


def readyz_until(server: Server, status: int, timeout: float = 20) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        answer = server.request("GET", "/readyz")
        if answer.status_code == status or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def test_killed_idle_parsers_are_reported_by_readyz_and_started_again(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    body = json_dataset(5_000, seed=0)
    assert len(body) > 64 * 1024
    assert upload(server, body).status_code == 201
    children = parser_children(server)
    assert children

    for child in children:
        os.kill(child, signal.SIGKILL)

    broken = readyz_until(server, 503)
    assert broken.status_code == 503, broken.text
    assert broken.headers["content-type"] == "application/problem+json"
    assert "parsing big JSON bodies" in broken.json()["detail"]
    assert server.request("GET", "/healthz").status_code == 200
    # Started again: ready once a new child answered.
    assert readyz_until(server, 200).status_code == 200
    assert parser_children(server).isdisjoint(children)
    stored = upload(server, body)
    assert stored.status_code == 201, stored.text
    assert stored.json()["n_rows"] == 5_000


def test_the_upload_whose_parser_is_killed_is_a_503_and_the_next_one_is_stored(
    make_sqlite_server: ServerFactory,
):
    server = make_sqlite_server()
    assert upload(server, json_dataset(5_000, seed=1)).status_code == 201
    idle = {child: cpu_ticks(child) for child in parser_children(server)}
    # Seconds of parsing: time to see which child works on it and kill it.
    big_body = json_dataset(400_000, seed=2)
    answers: list[httpx.Response] = []
    poster = threading.Thread(target=lambda: answers.append(upload(server, big_body)))
    poster.start()
    deadline = time.monotonic() + 30
    busy: set[int] = set()
    while not busy and time.monotonic() < deadline:
        time.sleep(0.05)
        busy = {
            child
            for child in parser_children(server)
            if child not in idle or cpu_ticks(child) > idle[child] + 20
        }
    assert busy, "no parser child started on the big body"
    for child in busy:
        os.kill(child, signal.SIGKILL)
    poster.join()

    (lost,) = answers
    assert lost.status_code == 503, lost.text
    assert lost.headers["content-type"] == "application/problem+json"
    assert lost.headers["retry-after"] == "1"
    detail = lost.json()["detail"]
    assert f"{len(big_body)}-byte JSON body" in detail
    assert "ended before it answered" in detail
    # Straight away, without waiting for a probe: the pool was started again.
    stored = upload(server, json_dataset(5_000, seed=3))
    assert stored.status_code == 201, stored.text
    fit = server.request(
        "POST",
        "/fit",
        content=json.dumps(
            {"data": json.loads(json_dataset(5_000, seed=4)), "k": 1, "algorithm": "am-classic"}
        ),
        headers={"content-type": "application/json"},
    )
    assert fit.status_code == 202, fit.text


def test_parsers_end_when_their_server_is_killed(make_sqlite_server: ServerFactory):
    # A parser waiting for work reads its own task queue (it holds both ends of that pipe):
    # only the pipe from the server tells it the server is gone.
    server = make_sqlite_server()
    assert upload(server, json_dataset(5_000, seed=0)).status_code == 201
    children = parser_children(server)
    assert children
    assert server.process is not None
    server.process.kill()
    server.process.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in children):
        time.sleep(0.1)
    alive = {pid for pid in children if Path(f"/proc/{pid}").exists()}
    assert not alive, f"parsers {sorted(alive)} outlived their server"
