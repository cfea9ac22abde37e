"""v2 REST bodies: JSON, and Triton's binary tensor extension (JSON header + tensor blobs, in tensor order).

The JSON part's length travels in ``Inference-Header-Content-Length``; without that header the whole body is
JSON. Content-Type is never consulted: tritonclient sends none, its aio client octet-stream, KServe JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from pipeserve.errors import InvalidInput
from pipeserve.types import TensorDict
from pipeserve.v2.datatypes import datatype_of, decode_json, decode_raw, encode_json, encode_raw, select_outputs

HEADER_LENGTH = "inference-header-content-length"


@dataclass(frozen=True, slots=True)
class InferRequestBody:
    """A decoded infer request: its tensors, which outputs it wants and how (binary or JSON)."""

    request_id: str | None
    inputs: TensorDict
    outputs: list[str] | None
    binary_outputs: dict[str, bool]
    binary_default: bool
    parameters: dict[str, Any]


def parse_json(body: bytes | memoryview) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the body is not valid JSON ({exc})", expected="a v2 inference request") from None


def parse_infer_request(body: bytes, header_length: str | None) -> InferRequestBody:
    """Decode an infer request body (JSON, or JSON + binary tensors).

    Raises:
        InvalidInput: malformed JSON, missing fields, a header length or binary sizes that do not add up.
    """
    view = memoryview(body)
    if header_length is not None:
        try:
            json_size = int(header_length)
        except ValueError:
            raise InvalidInput(f"{HEADER_LENGTH} is {header_length!r}", expected="a byte count") from None
        if not 0 <= json_size <= len(body):
            raise InvalidInput(
                f"{HEADER_LENGTH} is {json_size} for a {len(body)}-byte body", expected="0 <= value <= body size"
            )
    else:
        json_size = len(body)
    doc = parse_json(view[:json_size])
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise InvalidInput(
            "the request has no 'inputs' list", expected='{"inputs": [{"name", "shape", "datatype", "data"}]}'
        )
    inputs = _read_inputs(doc["inputs"], view, json_size)
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' is not an object", expected="an object")
    outputs, binary_outputs = _requested_outputs(doc.get("outputs"))
    binary_default = bool(parameters.get("binary_data_output", False))
    request_id = doc.get("id")
    return InferRequestBody(
        str(request_id) if request_id is not None else None, inputs, outputs, binary_outputs, binary_default, parameters
    )


def _read_inputs(items: list[Any], view: memoryview, json_size: int) -> TensorDict:
    """The input tensors: JSON ``data``, or binary blobs that follow the JSON header in input order."""
    offset = json_size
    inputs: TensorDict = {}
    for item in items:
        name, datatype, shape = _tensor_header(item)
        if name in inputs:
            raise InvalidInput(f"input {name!r} appears twice", expected="each input once")
        params = item.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(view):
                raise InvalidInput(
                    f"input {name!r} says binary_data_size {size} but {len(view) - offset} bytes remain",
                    expected=f"binary tensors after the {json_size}-byte JSON header, in input order",
                )
            inputs[name] = decode_raw(view[offset : offset + size], datatype, shape, name=name)
            offset += size
        elif "data" in item:
            inputs[name] = decode_json(item["data"], datatype, shape, name=name)
        else:
            raise InvalidInput(f"input {name!r} has no data", expected="'data', or parameters.binary_data_size")
    if offset != len(view):
        raise InvalidInput(
            f"{len(view) - offset} bytes follow the last tensor",
            expected=f"{HEADER_LENGTH} and binary_data_size to add up",
        )
    return inputs


def _requested_outputs(given: Any) -> tuple[list[str] | None, dict[str, bool]]:
    """The names of the requested outputs (None: all) and which of them asked for binary data."""
    if given is None:
        return None, {}
    if not isinstance(given, list):
        raise InvalidInput("'outputs' is not a list", expected='[{"name": ...}]')
    outputs: list[str] = []
    binary: dict[str, bool] = {}
    for out in given:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise InvalidInput("an output has no name", expected='{"name": ...}')
        outputs.append(out["name"])
        params = out.get("parameters") or {}
        if isinstance(params, dict) and "binary_data" in params:
            binary[out["name"]] = bool(params["binary_data"])
    return outputs, binary


def _tensor_header(item: Any) -> tuple[str, str, list[int]]:
    if not isinstance(item, dict):
        raise InvalidInput("an input is not an object", expected='{"name", "shape", "datatype", "data"}')
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if not isinstance(name, str):
        raise InvalidInput("an input has no name", expected='"name": a string')
    if not isinstance(datatype, str):
        raise InvalidInput(f"input {name!r} has no datatype", expected='"datatype": e.g. "FP32"')
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise InvalidInput(f"input {name!r} has shape {shape!r}", expected="a list of integers")
    return name, datatype, shape


def encode_infer_response(
    model_name: str,
    version: str,
    request: InferRequestBody,
    outputs: TensorDict,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length.

    Raises:
        InvalidInput: a requested output the model does not have.
    """
    selected = select_outputs(outputs, request.outputs)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": version}
    if request.request_id is not None:
        doc["id"] = request.request_id
    if parameters:
        doc["parameters"] = dict(parameters)
    blobs: list[bytes] = []
    items = []
    for name, array in selected.items():
        item: dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype), "shape": list(array.shape)}
        if request.binary_outputs.get(name, request.binary_default):
            blob = encode_raw(array)
            item["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            item["data"] = encode_json(array)
        items.append(item)
    doc["outputs"] = items
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def encode_infer_request(
    inputs: TensorDict,
    outputs: list[str] | None = None,
    *,
    binary: bool = True,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """A client's request body (binary inputs and outputs, or plain JSON for servers without the extension)."""
    doc: dict[str, Any] = {}
    if request_id is not None:
        doc["id"] = request_id
    params = dict(parameters or {})
    if binary and not outputs:
        params["binary_data_output"] = True
    if params:
        doc["parameters"] = params
    blobs: list[bytes] = []
    items = []
    for name, array in inputs.items():
        item: dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype), "shape": list(array.shape)}
        if binary:
            blob = encode_raw(array)
            item["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            item["data"] = encode_json(array)
        items.append(item)
    doc["inputs"] = items
    if outputs:
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": binary}} for n in outputs]
    header = orjson.dumps(doc)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def decode_infer_response(body: bytes, header_length: str | None) -> tuple[dict[str, Any], TensorDict]:
    """A response's JSON document and its output tensors (binary or JSON ``data``)."""
    view = memoryview(body)
    json_size = int(header_length) if header_length is not None else len(body)
    doc = parse_json(view[:json_size])
    if not isinstance(doc, dict) or not isinstance(doc.get("outputs"), list):
        raise InvalidInput("the response has no 'outputs' list", expected="a v2 inference response")
    offset = json_size
    tensors: TensorDict = {}
    for item in doc["outputs"]:
        name, datatype, shape = _tensor_header(item)
        params = item.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            tensors[name] = decode_raw(view[offset : offset + int(size)], datatype, shape, name=name)
            offset += int(size)
        else:
            tensors[name] = decode_json(item.get("data"), datatype, shape, name=name)
    return doc, tensors
