"""The edge middleware in process: it is the app's only middleware, its fast path answers the
plain predict bodies of cached models (byte for byte as the routes do) and hands every other
on, and its access lines are written in order, batched on the hot path."""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi.testclient import TestClient

from service.api.middleware import EdgeMiddleware
from service.logs import ACCESS_LOGGER, AccessLog
from service.serving.endpoint import fast_json_predict


def test_every_check_before_routing_is_one_middleware(client: TestClient):
    assert [middleware.cls for middleware in client.app.user_middleware] == [EdgeMiddleware]  # type: ignore[attr-defined]


def edge_answer(client: TestClient, body: dict, accept: str | None = None):
    state = client.app.state  # type: ignore[attr-defined]
    return fast_json_predict(
        json.dumps(body).encode(),
        "application/json",
        accept,
        cache=state.model_cache,
        resolver=state.reference_resolver,
        settings=state.settings,
    )


def test_the_fast_path_answers_plain_bodies_of_cached_models(client: TestClient, model_id):
    plain = {"model_id": model_id, "X": [[0.5, -1.0], [2.0, 3.0]]}
    # Not cached yet: handed on (the route loads the model in the thread pool).
    assert edge_answer(client, plain) is None
    routed = client.post("/predict?output=predictions", json=plain)
    assert routed.status_code == 200
    for body in (plain, {**plain, "y": [1.0, 2.0]}, {"model_id": model_id, "X": [[1, 2]]}):
        answer = edge_answer(client, body)
        assert answer is not None, body
        routed = client.post("/predict?output=predictions", json=body)
        assert answer.body == routed.content
        assert answer.media_type == routed.headers["content-type"]
        assert answer.headers == {"Mixreg-Model-Id": model_id}
    declined = [
        {"model_id": model_id, "X": [[0.5, -1.0]], "groups": ["a"]},  # not a plain body
        {"model_id": model_id, "X": [[0.5, -1.0, 3.0]]},  # wrong width: the route explains
        {"model_id": model_id, "X": [[0.5, None]]},
        {"model_id": "0" * 32, "X": [[0.5, -1.0]]},  # not cached (nor anywhere)
        {"X": [[0.5, -1.0]]},
    ]
    for body in declined:
        assert edge_answer(client, body) is None, body
    assert edge_answer(client, plain, accept="application/x-npy") is None
    state = client.app.state  # type: ignore[attr-defined]
    npy_body = fast_json_predict(
        json.dumps(plain).encode(),
        "application/x-npy",
        None,
        cache=state.model_cache,
        resolver=state.reference_resolver,
        settings=state.settings,
    )
    assert npy_body is None


def test_a_big_answer_is_left_to_the_thread_pool(client: TestClient, model_id):
    client.post("/predict", json={"model_id": model_id, "X": [[0.0, 0.0]]})
    rows = [[0.25, 0.5]] * 5000  # 10,000 values: over INLINE_ANSWER_VALUES
    assert edge_answer(client, {"model_id": model_id, "X": rows}) is None
    assert edge_answer(client, {"model_id": model_id, "X": rows[:100]}) is not None


def scope(path: str) -> dict:
    return {
        "client": ("127.0.0.1", 5000),
        "method": "POST",
        "path": path,
        "query_string": b"",
        "http_version": "1.1",
    }


def test_access_lines_keep_their_order_and_are_batched_on_the_hot_path(caplog):
    access_log = AccessLog()
    written: list[tuple[str, str]] = []

    async def run() -> None:
        access_log.record(scope("/predict"), 200, "first", batched=True)
        access_log.record(scope("/predict"), 200, "second", batched=True)
        written.extend(("now", record.request_id) for record in caplog.records)  # type: ignore[attr-defined]
        await asyncio.sleep(2 * AccessLog.FLUSH_DELAY_S)
        written.extend(("later", record.request_id) for record in caplog.records)  # type: ignore[attr-defined]
        caplog.clear()
        access_log.record(scope("/predict"), 200, "third", batched=True)
        access_log.record(scope("/jobs"), 404, "fourth", batched=False)
        written.extend(("at once", record.request_id) for record in caplog.records)  # type: ignore[attr-defined]

    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        asyncio.run(run())
    assert written == [
        ("later", "first"),
        ("later", "second"),
        ("at once", "third"),
        ("at once", "fourth"),
    ]
    assert [record.getMessage() for record in caplog.records] == [
        '127.0.0.1:5000 - "POST /predict HTTP/1.1" 200',
        '127.0.0.1:5000 - "POST /jobs HTTP/1.1" 404',
    ]
    assert {record.name for record in caplog.records} == {ACCESS_LOGGER}


def test_no_access_line_when_the_access_logger_is_quieter(caplog):
    # As with ``mixreg serve --log-level warning``, which sets uvicorn's loggers' levels.
    access_log = AccessLog()
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.WARNING)
    try:
        with caplog.at_level(logging.INFO):
            access_log.record(scope("/jobs"), 200, "quiet", batched=False)
    finally:
        logging.getLogger(ACCESS_LOGGER).setLevel(logging.NOTSET)
    assert not [record for record in caplog.records if record.name == ACCESS_LOGGER]
