"""Request and response bodies of the Open Inference Protocol (KServe v2) routes, ``/v2/...``.

Field names follow the protocol, so off-the-shelf clients (Triton's ``tritonclient``, KServe's
``InferenceRESTClient``) read and write them unchanged.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

EXAMPLE_MODEL_ID = "3f2b9c0e8d7a4b6c9e1f2a3b4c5d6e7f"


class MetadataTensor(BaseModel):
    """A tensor a model takes or gives: its name, datatype and shape (-1: any length)."""

    name: str
    datatype: str
    shape: list[int]


class ServerMetadata(BaseModel):
    """The server's name, version and the protocol extensions it supports."""

    name: str
    version: str
    extensions: list[str]


class ModelMetadata(BaseModel):
    """A model's versions, platform, inputs and outputs."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": EXAMPLE_MODEL_ID,
                    "versions": ["1"],
                    "platform": "mixreg",
                    "inputs": [{"name": "X", "datatype": "FP64", "shape": [-1, 2]}],
                    "outputs": [{"name": "predictions", "datatype": "FP64", "shape": [-1, 3]}],
                }
            ]
        }
    )

    name: str
    versions: list[str]
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]


class RequestInput(BaseModel):
    """An input tensor: inline ``data`` (flat in row-major order, or nested), or with
    ``parameters.binary_data_size`` raw little-endian bytes after the JSON header."""

    name: str = Field(max_length=256)
    shape: list[int] = Field(max_length=8)
    datatype: str = Field(max_length=16)
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class RequestOutput(BaseModel):
    """An output asked for; ``parameters.binary_data`` returns it as binary data."""

    name: str = Field(max_length=256)
    parameters: dict[str, Any] | None = None


class InferenceRequest(BaseModel):
    """An inference request (the JSON header of a request with binary tensor data)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "request-1",
                    "inputs": [
                        {
                            "name": "X",
                            "shape": [2, 2],
                            "datatype": "FP64",
                            "data": [0.5, 0.5, -0.2, 0.9],
                        }
                    ],
                    "outputs": [{"name": "predictions"}],
                }
            ]
        }
    )

    id: str | None = Field(default=None, max_length=256)
    parameters: dict[str, Any] | None = None
    inputs: list[RequestInput] = Field(max_length=16)
    outputs: list[RequestOutput] | None = Field(default=None, max_length=16)


class ResponseOutput(BaseModel):
    """An output tensor: inline ``data`` (flat, row-major), or ``parameters.binary_data_size``
    bytes of binary data after the JSON header."""

    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[int] | list[float] | None = None


class InferenceResponse(BaseModel):
    """The answer to an inference request."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model_name": EXAMPLE_MODEL_ID,
                    "model_version": "1",
                    "id": "request-1",
                    "outputs": [
                        {
                            "name": "predictions",
                            "shape": [2, 3],
                            "datatype": "FP64",
                            "data": [1.5, -0.25, 3.0, 0.9, 1.1, -2.0],
                        }
                    ],
                }
            ]
        }
    )

    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[ResponseOutput]
