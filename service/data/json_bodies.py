"""Big JSON bodies (datasets, fits with inline data) parsed in a child process.

Parsing tens of megabytes of JSON into Python floats holds the GIL for seconds (``json`` and
pydantic alike), so a worker thread would still stop the event loop; a process does not. The
child validates the body and turns its rows into arrays, which travel back as raw bytes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from pydantic import ValidationError

from service.data import ingest
from service.errors import ServiceUnavailableError
from service.schemas import DatasetIn

_Parsed = TypeVar("_Parsed")

PARSE_IN_A_CHILD_BYTES = 64 * 1024
"""JSON dataset and fit bodies larger than this are parsed in a child process."""

# Two bodies parsed at once; more wait. Started on first use, never at import.
_PARSERS = 2
_executor: ProcessPoolExecutor | None = None
# The first task of a pool started again after it lost a child: done once a new child answers.
_warm_up: Future[int] | None = None
_executor_lock = threading.Lock()
_niceness = 0
# The pipe whose write end only this (the server's) process holds: a parser reads its end and
# ends itself at end of file, when the server is gone (a parser waiting for work reads its own
# task queue, of which it holds both ends, and would never notice).
_server_alive: tuple[Connection, Connection] | None = None

PARSER_RETRY_AFTER_S = 1
"""The ``Retry-After`` of the 503 sent when the process parsing a body ended before it
answered: the pool is started again at once, so a retry a second later finds new children."""


def set_parser_niceness(niceness: int) -> None:
    """Run the parsing processes started from now on ``niceness`` steps nicer than the server
    (the app's ``MIXREG_FIT_NICENESS``): parsing a big body is batch work, like a fit, and
    must leave the CPU to the requests first."""
    global _niceness
    with _executor_lock:
        _niceness = niceness


def _start_parser(niceness: int, server_alive: Connection) -> None:
    """A parser's start: ``niceness`` steps nicer, and a thread that ends the process once
    the server is gone (``server_alive``: the read end of a pipe only the server writes to)."""
    os.nice(niceness)

    def watch() -> None:
        try:
            server_alive.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)

    threading.Thread(target=watch, name="mixreg-parser-server-watch", daemon=True).start()


def _parsers() -> ProcessPoolExecutor:
    global _executor, _server_alive
    with _executor_lock:
        if _executor is None:
            context = multiprocessing.get_context("forkserver")
            if _server_alive is None:
                _server_alive = context.Pipe(duplex=False)
            _executor = ProcessPoolExecutor(
                max_workers=_PARSERS,
                mp_context=context,
                initializer=_start_parser,
                initargs=(_niceness, _server_alive[0]),
            )
        return _executor


def _is_broken(executor: ProcessPoolExecutor) -> bool:
    # The executor's own flag, set by its manager thread as soon as any child dies (even an
    # idle one): a broken pool never takes work again, and says so only through this flag or
    # by failing every later submit.
    return bool(executor._broken)


def _start_again(broken: ProcessPoolExecutor) -> None:
    """Replace the pool ``broken`` (if it is still the current one) by a new one, which starts
    a child at once; other requests may have done so already."""
    global _executor, _warm_up
    with _executor_lock:
        if _executor is not broken:
            return
        _executor = None
    broken.shutdown(wait=False, cancel_futures=True)
    warm_up = _parsers().submit(os.getpid)
    with _executor_lock:
        _warm_up = warm_up


def parser_trouble() -> str | None:
    """Why big JSON bodies cannot be parsed right now, or None when they can.

    A pool that lost a child is started again here (the readiness probe calls this, so a server
    taken out of rotation by its probe does not wait for a body to recover); until a child of the
    new pool has answered, the parsers are reported as starting."""
    with _executor_lock:
        executor, warm_up = _executor, _warm_up
    if executor is not None and _is_broken(executor):
        _start_again(executor)
        return (
            "a process parsing big JSON bodies ended abruptly (killed, or out of memory); "
            "the parsers are being started again"
        )
    if warm_up is not None and not warm_up.done():
        return "the processes that parse big JSON bodies are being started again"
    if warm_up is not None and warm_up.exception() is not None:
        return f"the processes that parse big JSON bodies failed to start: {warm_up.exception()}"
    return None


async def in_a_child(parse: Callable[[bytes], _Parsed], body: bytes) -> _Parsed:
    """``parse(body)`` in a child process, awaited without blocking the loop.

    A pool that lost a child before ``body`` was given to it is started again and given the
    body. If the child parsing ``body`` itself ends before answering (killed, or out of memory:
    a body can be what exhausted it), the pool is started again and the request answered with
    ``ServiceUnavailableError`` rather than parsed once more."""
    executor = _parsers()
    try:
        future = executor.submit(parse, body)
    except BrokenProcessPool:
        _start_again(executor)
        executor = _parsers()
        future = executor.submit(parse, body)
    try:
        return await asyncio.wrap_future(future)
    except BrokenProcessPool:
        _start_again(executor)
        raise ServiceUnavailableError(
            f"the process parsing this {len(body)}-byte JSON body ended before it answered "
            f"(killed, or out of memory); the parsers were started again: retry, or send the "
            f"data as Parquet or NPZ, which take far less memory to read",
            retry_after_s=PARSER_RETRY_AFTER_S,
        ) from None


def stop_parsers() -> None:
    """End the child processes that parse bodies (at the app's shutdown); the next body
    starts them again."""
    global _executor, _warm_up
    with _executor_lock:
        executor, _executor, _warm_up = _executor, None, None
    if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)


ValidationErrors = list[dict[str, Any]]
"""The validation errors of a body's schema (with ``loc`` starting at ``"body"``)."""


def located_in_the_body(exc: ValidationError) -> ValidationErrors:
    # Without the input: it can be the whole body, and it would travel back from the child.
    return [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_input=False)]


ParsedBody = tuple[DatasetIn, ingest.ParsedDataset] | ValidationErrors
"""A body's fields (its arrays emptied) and its arrays, or the validation errors of its
schema (with ``loc`` starting at ``"body"``)."""


def parse_dataset_body(body: bytes) -> ParsedBody:
    """Validate a JSON dataset body and convert its rows to arrays (raises ``IngestError``
    for rows that cannot be used, as ``ingest.parse_arrays`` does)."""
    try:
        dataset = DatasetIn.model_validate_json(body)
    except ValidationError as exc:
        return located_in_the_body(exc)
    parsed = ingest.parse_arrays(dataset.X, dataset.y, dataset.feature_names, dataset.columns)
    # The lists are not sent back: the arrays hold the same values in a fraction of the bytes.
    return dataset.model_copy(update={"X": [], "y": [], "columns": None}), parsed


async def parse_dataset_body_in_a_child(body: bytes) -> ParsedBody:
    """:func:`parse_dataset_body` in a child process, awaited without blocking the loop."""
    return await in_a_child(parse_dataset_body, body)
