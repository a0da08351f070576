"""A typed client of the mixreg service, sync and async, on httpx.

It needs only httpx and NumPy (pandas and pyarrow are used only when given a DataFrame or a
Parquet file), so it installs in any notebook or script environment::

    from mixreg_client import Client

    with Client("http://127.0.0.1:8000") as client:
        dataset = client.upload("data.csv", target="y")
        job = client.fit(dataset, k=2).wait(progress=lambda job: print(job.progress.fraction))
        predictions = client.predict(job.model_id, X)  # shape (n, k)

Every failed request raises :class:`MixregError`, which carries the server's problem+json.
"""

from mixreg_client._async import AsyncClient, AsyncFitJob
from mixreg_client._errors import MixregError
from mixreg_client._sync import Client, FitJob
from mixreg_client._types import (
    Alias,
    Component,
    Dataset,
    EstimatesTable,
    GatedPredictions,
    GroupPredictions,
    Job,
    JobStatus,
    KeyedSummary,
    Model,
    ModelSummary,
    ModelVersion,
    Progress,
    RegisteredModel,
    Scores,
    Sweep,
    SweepModel,
)

__all__ = [
    "Alias",
    "AsyncClient",
    "AsyncFitJob",
    "Client",
    "Component",
    "Dataset",
    "EstimatesTable",
    "FitJob",
    "GatedPredictions",
    "GroupPredictions",
    "Job",
    "JobStatus",
    "KeyedSummary",
    "MixregError",
    "Model",
    "ModelSummary",
    "ModelVersion",
    "Progress",
    "RegisteredModel",
    "Scores",
    "Sweep",
    "SweepModel",
]
