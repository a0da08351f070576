"""Upload datasets once, fit them many times."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from models_store import datasets as dataset_store
from service import limits
from service.api import cursors
from service.api.deps import SessionDep, SessionFactoryDep, SettingsDep, ValidDataset
from service.auth.middleware import ApiKeyDep
from service.data.datasets import TableOptions, delete_dataset, listed_names, read_upload
from service.data.idempotency import store_upload_once
from service.schemas import MAX_OFFSET, MAX_TEXT_LENGTH, DatasetIn, DatasetOut, Page
from service.views import dataset_out

router = APIRouter(prefix="/datasets", tags=["datasets"])

_FILE_FIELD = {
    "type": "string",
    "format": "binary",
    "description": "a .csv file with a header row, a .parquet file (numeric columns), or an "
    ".npz archive with arrays X, y and optionally feature_names",
}
_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": DatasetIn.model_json_schema()},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": _FILE_FIELD,
                        "X": {
                            "type": "string",
                            "format": "binary",
                            "description": "instead of file: a 2-D .npy array of features",
                        },
                        "y": {
                            "type": "string",
                            "format": "binary",
                            "description": "with X: a 1-D .npy array of targets",
                        },
                        "target": {
                            "type": "string",
                            "description": "CSV and Parquet: the name of the column to predict",
                        },
                        "features": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "CSV and Parquet: the feature columns, in this order "
                            "(comma-separated or repeated); default every column but the target",
                        },
                        "ignore": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "CSV and Parquet: columns to leave out, such as an id "
                            "or a text column (comma-separated or repeated)",
                        },
                        "delimiter": {
                            "type": "string",
                            "description": "CSV: the field delimiter; default the one of , ; tab "
                            "| that the header holds most",
                        },
                        "keep": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "CSV, Parquet and NPZ: columns (NPZ: 1-D arrays) kept "
                            "beside the features and the target as extra columns, such as a "
                            "group id or a weight; never features (comma-separated or repeated)",
                        },
                        "feature_names": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": ".npy files: one name per column of X "
                            "(comma-separated or repeated)",
                        },
                        "na": {
                            "type": "string",
                            "enum": ["error", "drop"],
                            "description": "CSV: what an empty feature or target cell does: "
                            "error (the default) refuses the upload naming it, drop leaves its "
                            "row out (counted per column in dropped_rows)",
                        },
                        "name": {"type": "string"},
                    },
                }
            },
            "text/csv": {
                "schema": {"type": "string"},
                "description": "a CSV with a header row; name the target with ?target=",
            },
            "application/vnd.apache.parquet": {
                "schema": {"type": "string", "format": "binary"},
                "description": "a Parquet file; name the target column with ?target=",
            },
            "application/x-npz": {
                "schema": {"type": "string", "format": "binary"},
                "description": "an .npz archive with arrays X, y (and feature_names)",
            },
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    openapi_extra=_UPLOAD_BODY,
    responses={
        409: {"description": "the Idempotency-Key was used for a different upload"},
        413: {
            "description": "over MIXREG_MAX_UPLOAD_BYTES, MIXREG_MAX_ROWS or MIXREG_MAX_FEATURES"
        },
        415: {"description": "the body or file is not JSON, CSV, Parquet, NPZ or .npy"},
    },
    summary="Upload a dataset as JSON, a CSV, Parquet or NPZ file, two .npy files, or a raw "
    "CSV, Parquet or NPZ body",
)
async def create(
    request: Request,
    response: Response,
    session_factory: SessionFactoryDep,
    settings: SettingsDep,
    api_key: ApiKeyDep,
    target: Annotated[
        str | None,
        Query(
            description="raw CSV and Parquet bodies: the column to predict",
            max_length=MAX_TEXT_LENGTH,
        ),
    ] = None,
    features: Annotated[
        list[str] | None,
        Query(
            description="raw CSV and Parquet bodies: the feature columns, in this order "
            "(comma-separated or repeated); default every column but the target",
        ),
    ] = None,
    ignore: Annotated[
        list[str] | None,
        Query(
            description="raw CSV and Parquet bodies: columns to leave out, such as an id or a "
            "text column (comma-separated or repeated)",
        ),
    ] = None,
    delimiter: Annotated[
        str | None,
        Query(
            description="raw CSV bodies: the field delimiter; default the one of , ; tab | "
            "that the header holds most",
            min_length=1,
            max_length=1,
        ),
    ] = None,
    keep: Annotated[
        list[str] | None,
        Query(
            description="raw CSV, Parquet and NPZ bodies: columns (NPZ: 1-D arrays) kept beside "
            "the features and the target as extra columns, such as a group id or a weight; never "
            "features (comma-separated or repeated)",
        ),
    ] = None,
    na: Annotated[
        Literal["error", "drop"],
        Query(
            description="raw CSV bodies: what an empty feature or target cell does: error "
            "refuses the upload naming it, drop leaves its row out (counted per column in "
            "dropped_rows)",
        ),
    ] = "error",
    name: Annotated[
        str | None, Query(description="raw bodies: a name", max_length=MAX_TEXT_LENGTH)
    ] = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="retrying with the same key and upload returns the same dataset",
            max_length=255,
        ),
    ] = None,
) -> DatasetOut:
    """Store ``X`` and ``y`` and return the dataset's id, rows and features."""
    options = TableOptions(
        target=target,
        features=listed_names(features) or None,
        ignore=listed_names(ignore),
        delimiter=delimiter,
        keep=listed_names(keep),
        na=na,
    )
    upload = await read_upload(request, options=options, name=name, settings=settings)
    try:
        staged = upload.staged
        limits.check_upload_names(
            name=upload.name,
            feature_names=staged.feature_names,
            target_name=staged.target_name,
            kept=list(staged.kept),
        )
        stored = await run_in_threadpool(
            store_upload_once,
            session_factory,
            upload,
            idempotency_key=idempotency_key,
            api_key_id=api_key.id if api_key is not None else None,
        )
    finally:
        upload.close()
    dataset = dataset_out(stored.dataset)
    response.headers["Location"] = dataset.url
    if not stored.created:
        response.headers["Idempotent-Replayed"] = "true"
    return dataset.model_copy(update={"dropped_rows": dict(staged.dropped_rows)})


@router.get("", response_model=Page[DatasetOut])
def list_(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    cursor: cursors.CursorQuery = None,
) -> Page[DatasetOut]:
    """Stored datasets, newest first."""
    after = cursors.page_key(cursor, offset=offset)
    rows, total = dataset_store.list_datasets(session, limit=limit + 1, offset=offset, after=after)
    datasets, next_cursor = cursors.next_page(rows, limit)
    return Page[DatasetOut](
        items=[dataset_out(dataset) for dataset in datasets],
        total=total,
        limit=limit,
        offset=offset,
        next_cursor=next_cursor,
    )


@router.get("/{dataset_id}", response_model=DatasetOut)
def get(dataset: ValidDataset) -> DatasetOut:
    """One dataset's shape and names."""
    return dataset_out(dataset)


@router.delete(
    "/{dataset_id}",
    status_code=204,
    response_class=Response,
    responses={
        404: {"description": "no such dataset"},
        409: {"description": "a queued or running fit uses the dataset"},
    },
)
def delete(
    dataset_id: Annotated[str, Path(description="id of a stored dataset")], session: SessionDep
) -> None:
    """Delete a dataset and its rows. Jobs and models fitted on it keep its id; a dataset that
    a queued or running fit uses is kept (409) until the fit is finished or cancelled."""
    delete_dataset(session, dataset_id=dataset_id)
