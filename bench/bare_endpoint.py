"""The comparison endpoints of ``bench.serving``: FastAPI routes that parse the predict body
(``model_id`` and the rows ``X``) into a pydantic model and return a constant list of k floats,
served by uvicorn with the same settings as ``mixreg serve``.

Two apps, the HTTP stack's own rate with and without a thread hop:

- ``async_app``: an ``async def`` route, run on the event loop (as mixreg's predict is);
- ``sync_app``: a plain ``def`` route, run in the thread pool.
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from pydantic import BaseModel

N_COMPONENTS = int(os.environ.get("BARE_N_COMPONENTS", "4"))
PREDICTION = [0.5 * index for index in range(N_COMPONENTS)]


class PredictBody(BaseModel):
    """The body mixreg's single-row predict is sent."""

    model_id: str
    X: list[list[float]]


async_app = FastAPI()
sync_app = FastAPI()


@async_app.get("/healthz")
@sync_app.get("/healthz")
async def healthz() -> dict[str, str]:
    """Ready (the benchmark waits for it)."""
    return {"status": "ok"}


@async_app.post("/predict")
async def predict_async(body: PredictBody) -> list[float]:
    """A constant list of k floats, on the event loop."""
    return PREDICTION


@sync_app.post("/predict")
def predict_sync(body: PredictBody) -> list[float]:
    """A constant list of k floats, in the thread pool."""
    return PREDICTION
