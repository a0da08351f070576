"""The comparison endpoint of ``bench.serving``: a plain sync FastAPI route returning a constant
list of k floats, served by uvicorn with the same settings as ``mixreg serve``."""

from __future__ import annotations

import os

from fastapi import FastAPI

N_COMPONENTS = int(os.environ.get("BARE_N_COMPONENTS", "4"))
PREDICTION = [0.5 * index for index in range(N_COMPONENTS)]

app = FastAPI()


@app.post("/predict")
def predict() -> list[float]:
    """A constant list of k floats."""
    return PREDICTION
