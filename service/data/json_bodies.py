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
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from pydantic import TypeAdapter, ValidationError

from service.data import ingest
from service.jobs.submit import PreparedFit, prepare_fit
from service.schemas import DatasetIn, FitRequest, FitVariant

PARSE_IN_A_CHILD_BYTES = 64 * 1024
"""JSON dataset and fit bodies larger than this are parsed in a child process."""

# Two bodies parsed at once; more wait. Started on first use, never at import.
_PARSERS = 2
_executor: ProcessPoolExecutor | None = None
_executor_lock = threading.Lock()
_niceness = 0


def set_parser_niceness(niceness: int) -> None:
    """Run the parsing processes started from now on ``niceness`` steps nicer than the server
    (the app's ``MIXREG_FIT_NICENESS``): parsing a big body is batch work, like a fit, and
    must leave the CPU to the requests first."""
    global _niceness
    with _executor_lock:
        _niceness = niceness


def _parsers() -> ProcessPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ProcessPoolExecutor(
                max_workers=_PARSERS,
                mp_context=multiprocessing.get_context("forkserver"),
                initializer=os.nice,
                initargs=(_niceness,),
            )
        return _executor


def stop_parsers() -> None:
    """End the child processes that parse bodies (at the app's shutdown); the next body
    starts them again."""
    global _executor
    with _executor_lock:
        executor, _executor = _executor, None
    if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)


ValidationErrors = list[dict[str, Any]]
"""The validation errors of a body's schema (with ``loc`` starting at ``"body"``)."""


def _located_in_the_body(exc: ValidationError) -> ValidationErrors:
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
        return _located_in_the_body(exc)
    parsed = ingest.parse_arrays(dataset.X, dataset.y, dataset.feature_names, dataset.columns)
    # The lists are not sent back: the arrays hold the same values in a fraction of the bytes.
    return dataset.model_copy(update={"X": [], "y": [], "columns": None}), parsed


async def parse_dataset_body_in_a_child(body: bytes) -> ParsedBody:
    """:func:`parse_dataset_body` in a child process, awaited without blocking the loop."""
    return await asyncio.wrap_future(_parsers().submit(parse_dataset_body, body))


_FIT_REQUEST: TypeAdapter[FitVariant] = TypeAdapter(FitRequest)


def parse_fit_body(body: bytes) -> PreparedFit | ValidationErrors:
    """Validate a JSON fit body and prepare it (``service.jobs.submit.prepare_fit``: its hash,
    and its inline rows as arrays; raises ``InvalidInputError`` for rows that cannot be
    fitted)."""
    try:
        request = _FIT_REQUEST.validate_json(body)
    except ValidationError as exc:
        return _located_in_the_body(exc)
    return prepare_fit(request)


async def parse_fit_body_in_a_child(body: bytes) -> PreparedFit | ValidationErrors:
    """:func:`parse_fit_body` in a child process, awaited without blocking the loop."""
    return await asyncio.wrap_future(_parsers().submit(parse_fit_body, body))
