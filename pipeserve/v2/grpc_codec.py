"""gRPC v2 messages -> tensors (raw or typed contents) and parameters both ways, for both sides; ModelInfer
messages are written, raw contents only (tritonclient reads only those), by ``infer_proto``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pipeserve.errors import InvalidInput
from pipeserve.types import Tensor, TensorDict
from pipeserve.v2.datatypes import decode_raw, numpy_of

#: Where each datatype's elements go in InferTensorContents (typed, non-raw requests).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def get_parameters(params: Any) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` as plain Python values."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, which) if which else None
    return out


def set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


def tensors_of(specs: Iterable[Any], raw: Sequence[bytes | memoryview], *, what: str) -> TensorDict:
    """The named tensors of a message's tensor specs, from ``raw`` contents (one per spec) or typed ones.

    Raises:
        InvalidInput: sizes that do not match shapes, unknown datatypes, raw and typed contents both, input
            names that repeat.
    """
    specs = list(specs)
    if what == "input" and len(specs) > 1:
        _check_unique([spec.name for spec in specs])
    # Both at once is malformed in a request; a response may carry empty typed contents beside raw (MLServer).
    if raw and what == "input" and any(spec.HasField("contents") and spec.contents.ByteSize() for spec in specs):
        raise InvalidInput(f"{what}s carry both raw and typed contents", expected="one or the other, per message")
    if raw and len(raw) != len(specs):
        raise InvalidInput(f"{len(raw)} raw contents for {len(specs)} {what}s", expected=f"one raw entry per {what}")
    tensors: TensorDict = {}
    for i, spec in enumerate(specs):
        shape = list(spec.shape)
        if raw:
            tensors[spec.name] = decode_raw(raw[i], spec.datatype, shape, name=spec.name)
            continue
        field = _CONTENTS_FIELD.get(spec.datatype)
        if field is None:
            numpy_of(spec.datatype)  # unknown name -> InvalidInput
            raise InvalidInput(f"{what} {spec.name!r}: {spec.datatype} can only travel raw", expected="raw contents")
        values = list(getattr(spec.contents, field))
        if spec.datatype == "BYTES":
            array: Tensor = np.empty(len(values), dtype=object)
            array[:] = values
        else:
            try:
                array = np.asarray(values, dtype=numpy_of(spec.datatype))
            except OverflowError:
                raise InvalidInput(
                    f"{what} {spec.name!r} has values out of the range of {spec.datatype}", expected="values that fit"
                ) from None
        count = int(np.prod(shape)) if shape else 1
        if array.size != count:
            raise InvalidInput(
                f"{what} {spec.name!r} has {array.size} elements in its contents", expected=f"{count} for shape {shape}"
            )
        tensors[spec.name] = array.reshape(shape)
    return tensors


def _check_unique(names: list[str]) -> None:
    if len(set(names)) != len(names):
        raise InvalidInput(f"input names {names} repeat", expected="each input once")
