"""v2 tensor datatypes and their byte layouts (row-major, little-endian; BYTES as uint32-length-prefixed items).

Example:
    >>> datatype_of(np.dtype("float32"))
    'FP32'
    >>> decode_raw(encode_raw(np.array([b"pos", b"neg"], dtype=object)), "BYTES", [2]).tolist()
    [b'pos', b'neg']
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipeserve.errors import InvalidInput
from pipeserve.types import Tensor, TensorDict

#: v2 datatype name -> NumPy dtype (little-endian). BYTES is an object array of ``bytes``.
DATATYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_BY_KIND = {(dtype.kind, dtype.itemsize): name for name, dtype in DATATYPES.items() if name != "BYTES"}


def numpy_of(datatype: str) -> np.dtype[Any]:
    """The NumPy dtype of a v2 datatype name.

    Raises:
        InvalidInput: an unknown name.
    """
    try:
        return DATATYPES[datatype]
    except KeyError:
        raise InvalidInput(f"unknown datatype {datatype!r}", expected=f"one of {', '.join(DATATYPES)}") from None


def datatype_of(dtype: np.dtype[Any] | str) -> str:
    """The v2 datatype name of a NumPy dtype (strings and objects are BYTES)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return "BYTES"
    try:
        return _BY_KIND[(dtype.kind, dtype.itemsize)]
    except KeyError:
        raise ValueError(f"NumPy dtype {dtype} has no v2 datatype") from None


def element_count(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        if dim < 0:
            raise InvalidInput(f"shape {list(shape)} has a negative dimension", expected="dimensions >= 0")
        count *= int(dim)
    return count


def select_outputs(outputs: Mapping[str, Tensor], requested: Sequence[str] | None) -> TensorDict:
    """The outputs a request asked for, in its order (all of them when it named none).

    Raises:
        InvalidInput: a requested output the model does not have.
    """
    if not requested:
        return dict(outputs)
    unknown = [name for name in requested if name not in outputs]
    if unknown:
        raise InvalidInput(f"unknown outputs {unknown}", expected=f"outputs among {list(outputs)}")
    return {name: outputs[name] for name in requested}


def encode_raw(array: Tensor) -> bytes:
    """A tensor's bytes as v2 raw / binary data carries them."""
    if array.dtype.kind in "OUS":
        parts = []
        for item in array.reshape(-1):
            data = item.encode() if isinstance(item, str) else bytes(item)
            parts.append(struct.pack("<I", len(data)))
            parts.append(data)
        return b"".join(parts)
    want = DATATYPES[datatype_of(array.dtype)]
    return np.ascontiguousarray(array, dtype=want).tobytes()


def decode_raw(data: bytes | memoryview, datatype: str, shape: Sequence[int], *, name: str = "") -> Tensor:
    """A tensor from its raw bytes; the size must match ``shape`` exactly.

    Raises:
        InvalidInput: a size that does not match, or an unknown datatype.
    """
    count = element_count(shape)
    dtype = numpy_of(datatype)
    label = f"input {name!r}" if name else "tensor"
    if datatype == "BYTES":
        return _decode_bytes(memoryview(data), count, shape, label)
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise InvalidInput(
            f"{label} has {len(data)} bytes of {datatype} data",
            expected=f"{expected} bytes for shape {list(shape)}",
        )
    return np.frombuffer(data, dtype=dtype).reshape(tuple(shape))


def _decode_bytes(view: memoryview, count: int, shape: Sequence[int], label: str) -> Tensor:
    items: list[bytes] = []
    offset = 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise InvalidInput(f"{label}: BYTES data ends inside a length prefix", expected="uint32 LE length + bytes")
        (size,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + size > len(view):
            raise InvalidInput(f"{label}: a BYTES element runs past the end of the data", expected="complete items")
        items.append(bytes(view[offset : offset + size]))
        offset += size
    if len(items) != count:
        raise InvalidInput(f"{label} has {len(items)} BYTES elements", expected=f"{count} for shape {list(shape)}")
    out = np.empty(count, dtype=object)
    out[:] = items
    return out.reshape(tuple(shape))


def decode_json(data: Any, datatype: str, shape: Sequence[int], *, name: str = "") -> Tensor:
    """A tensor from JSON ``data`` (nested or flat, row-major).

    Raises:
        InvalidInput: element count or types that do not match.
    """
    dtype = numpy_of(datatype)
    count = element_count(shape)
    label = f"input {name!r}" if name else "tensor"
    if datatype in ("FP16",):
        raise InvalidInput(f"{label}: FP16 cannot travel in JSON", expected="binary data (binary_data_size)")
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=object).reshape(-1)
            out = np.empty(flat.size, dtype=object)
            out[:] = [item.encode() if isinstance(item, str) else item for item in flat]
            flat = out
        else:
            flat = np.asarray(data).reshape(-1)
            if flat.size and flat.dtype.kind not in "biuf":
                raise InvalidInput(f"{label} has {flat.dtype} data", expected=f"{datatype} numbers")
            if flat.dtype.kind == "f" and dtype.kind in "iu":  # NumPy reads [1, 2**64 - 1] as float64, inexactly
                flat = np.asarray(data, dtype=dtype).reshape(-1)
            flat = flat.astype(dtype, copy=False)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"{label}: data cannot be read as {datatype} ({exc})", expected="a (nested) list") from None
    if flat.size != count:
        raise InvalidInput(
            f"{label} has {flat.size} elements", expected=f"{count} for shape {list(shape)} (datatype {datatype})"
        )
    return flat.reshape(tuple(shape))


def encode_json(array: Tensor) -> list[Any]:
    """A tensor's elements, flat, for JSON (BYTES as UTF-8 text)."""
    flat = array.reshape(-1)
    if array.dtype.kind in "OUS":
        return [item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item) for item in flat]
    return list(flat.tolist())
