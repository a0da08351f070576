"""Upload datasets once, fit them many times."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from models_store import repository
from service.api.deps import SessionDep, SessionFactoryDep, ValidDataset
from service.api.schemas import MAX_OFFSET, DatasetIn, DatasetOut, Page
from service.api.views import dataset_out
from service.data.datasets import read_upload, store_dataset

router = APIRouter(prefix="/datasets", tags=["datasets"])

_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": DatasetIn.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "a .csv file with a header row, or an .npz archive "
                            "with arrays X, y and optionally feature_names",
                        },
                        "target": {
                            "type": "string",
                            "description": "CSV only: the name of the column to predict",
                        },
                        "name": {"type": "string"},
                    },
                }
            },
            "text/csv": {
                "schema": {"type": "string"},
                "description": "a CSV with a header row; name the target with ?target=",
            },
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    openapi_extra=_UPLOAD_BODY,
    summary="Upload a dataset as JSON, a CSV or NPZ file, or a raw CSV body",
)
async def create(
    request: Request,
    response: Response,
    session_factory: SessionFactoryDep,
    target: Annotated[
        str | None, Query(description="raw CSV bodies: the column to predict")
    ] = None,
    name: Annotated[str | None, Query(description="raw CSV bodies: a name")] = None,
) -> DatasetOut:
    """Store ``X`` and ``y`` and return the dataset's id, rows and features."""
    parsed, name = await read_upload(request, target=target, name=name)
    dataset = await run_in_threadpool(store_dataset, session_factory, parsed, name=name)
    response.headers["Location"] = dataset.url
    return dataset


@router.get("", response_model=Page[DatasetOut])
def list_(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[DatasetOut]:
    """Stored datasets, newest first."""
    datasets, total = repository.list_datasets(session, limit=limit, offset=offset)
    return Page[DatasetOut](
        items=[dataset_out(dataset) for dataset in datasets],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.get("/{dataset_id}", response_model=DatasetOut)
def get(dataset: ValidDataset) -> DatasetOut:
    """One dataset's shape and names."""
    return dataset_out(dataset)
