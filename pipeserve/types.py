"""Shared type aliases and small value types used across layers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

#: A tensor as it flows between nodes: a NumPy array with a leading batch dimension.
Tensor: TypeAlias = npt.NDArray[Any]
#: Named tensors, as a model runtime takes and returns them.
TensorDict: TypeAlias = dict[str, Tensor]
#: Any JSON-compatible value, as it arrives in ``{"data": ...}``.
JSON: TypeAlias = Any
#: A batched async function: one result per item, in order.
BatchFn: TypeAlias = Callable[[list[Any]], Awaitable[list[Any]]]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Name, dtype and shape of one model input or output; ``-1`` marks a dynamic dimension.

    Example:
        >>> TensorSpec("input", "float32", (-1, 4)).describe()
        'input: float32[-1, 4]'
    """

    name: str
    dtype: str
    shape: tuple[int, ...] | None = None

    def describe(self) -> str:
        dims = "?" if self.shape is None else ", ".join(str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.dtype, "shape": None if self.shape is None else list(self.shape)}


@dataclass(frozen=True, slots=True)
class Signature:
    """The inputs and outputs a model artifact declares."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def output_names(self) -> list[str]:
        return [spec.name for spec in self.outputs]

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [s.to_dict() for s in self.inputs], "outputs": [s.to_dict() for s in self.outputs]}


@dataclass(slots=True)
class RequestInfo:
    """What one request carries through the pipeline: its id and, filled in on the way, timing facts."""

    request_id: str
    deadline_s: float | None = None
    annotations: dict[str, Any] = field(default_factory=dict)


@lru_cache(maxsize=256)
def numpy_dtype(name: str) -> np.dtype[Any]:
    """Map a dtype name as runtimes report it (``float32``, ``FP32``, ``tensor(float)``) to NumPy.

    Raises:
        ValueError: the name is not a known tensor type.
    """
    key = name.strip()
    if key in _DTYPE_ALIASES:
        key = _DTYPE_ALIASES[key]
    try:
        return np.dtype(key)
    except TypeError as exc:
        raise ValueError(f"unknown tensor dtype {name!r}; expected e.g. float32, int64, uint8, bool") from exc


_DTYPE_ALIASES: Mapping[str, str] = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int16)": "int16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "object",
    "FP32": "float32",
    "FP64": "float64",
    "FP16": "float16",
    "INT64": "int64",
    "INT32": "int32",
    "INT16": "int16",
    "INT8": "int8",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "BOOL": "bool",
    "BYTES": "object",
    "string": "object",
    "bytes": "object",
}
