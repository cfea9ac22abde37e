"""Request ``data`` -> the first node's input, and the last node's output -> JSON-ready values."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import orjson

from pipeserve.errors import InvalidInput
from pipeserve.pipeline.spec import InputSpec
from pipeserve.types import numpy_dtype

_NOT_TENSORS = (str, bytes, dict, bool)
_KIND_NAMES = {"U": "text", "S": "bytes", "O": "null, nested or mixed values", "b": "booleans", "c": "complex numbers"}


def decode_data(spec: InputSpec, data: Any) -> Any:
    """Check and convert one request's ``data`` as ``spec`` describes.

    Raises:
        InvalidInput: what was wrong and what is expected.

    Example:
        >>> decode_data(InputSpec(kind="tensor", shape=[-1, 2]), [1, 2]).shape
        (1, 2)
    """
    if data is None:
        raise InvalidInput("'data' is missing or null", expected=_expected(spec))
    if spec.kind == "tensor":
        return _decode_tensor(spec, data)
    if spec.kind == "image":
        return _decode_image(data)
    return data


def _decode_tensor(spec: InputSpec, data: Any) -> np.ndarray[Any, Any]:
    if isinstance(data, _NOT_TENSORS):
        raise InvalidInput(f"'data' is {_describe(data)}", expected=_expected(spec))
    try:
        raw = np.asarray(data)
    except ValueError as exc:  # ragged nested lists
        raise InvalidInput(f"'data' is not rectangular ({exc})", expected=_expected(spec)) from exc
    if raw.dtype.kind not in "iuf":
        found = _KIND_NAMES.get(raw.dtype.kind, str(raw.dtype))
        raise InvalidInput(f"'data' holds {found}, not numbers", expected=_expected(spec))
    target = numpy_dtype(spec.dtype)
    if target.kind in "iu":
        _check_integers(spec, raw, target)
    with np.errstate(over="ignore", invalid="ignore"):  # float overflow becomes inf, refused just below
        array = raw.astype(target, copy=False)
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise InvalidInput(
            "'data' contains NaN or infinity (or a number too large for " + spec.dtype + ")", expected=_expected(spec)
        )
    if spec.shape is not None:
        array = _check_shape(spec, array, raw.shape)
    return _check_rows(spec, array)


def _check_integers(spec: InputSpec, raw: np.ndarray[Any, Any], target: np.dtype[Any]) -> None:
    if raw.size == 0:
        return
    if raw.dtype.kind == "f" and not (np.isfinite(raw).all() and (raw == np.floor(raw)).all()):
        raise InvalidInput("'data' holds numbers that are not whole", expected=_expected(spec))
    info = np.iinfo(target)
    if raw.min() < info.min or raw.max() > info.max:
        raise InvalidInput(
            f"'data' holds numbers outside the {target} range [{info.min}, {info.max}]", expected=_expected(spec)
        )


def _check_shape(spec: InputSpec, array: np.ndarray[Any, Any], original: tuple[int, ...]) -> np.ndarray[Any, Any]:
    assert spec.shape is not None  # the caller checks
    if array.ndim == len(spec.shape) - 1:
        array = array[None]
    if array.ndim != len(spec.shape) or any(
        want not in (-1, got) for want, got in zip(spec.shape, array.shape, strict=True)
    ):
        raise InvalidInput(f"'data' has shape {list(original)}", expected=_expected(spec))
    return array


def _check_rows(spec: InputSpec, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if array.ndim == 0:
        raise InvalidInput("'data' is a single number", expected=_expected(spec))
    if array.shape[0] == 0:
        raise InvalidInput("'data' has no rows", expected=_expected(spec))
    if array.shape[0] > spec.max_batch_rows:
        raise InvalidInput(
            f"'data' has {array.shape[0]} rows", expected=f"at most {spec.max_batch_rows} rows per request"
        )
    return array


def _decode_image(data: Any) -> bytes:
    if isinstance(data, bytes | bytearray):
        return bytes(data)
    if not isinstance(data, str):
        raise InvalidInput(f"'data' is {_describe(data)}", expected="a base64-encoded image as a JSON string")
    text = data
    if text.startswith("data:"):  # a data URL: data:image/jpeg;base64,....
        text = text.partition(",")[2]
    try:
        decoded = _b64decode(text)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(
            f"'data' is not valid base64 ({exc})", expected="a base64-encoded image (e.g. `base64 cat.jpg`)"
        ) from exc
    if not decoded:
        raise InvalidInput("'data' is an empty string", expected="a base64-encoded image")
    return decoded


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        # `base64 file` wraps lines at 76 characters; whitespace is not data, so drop it and try again.
        return base64.b64decode("".join(text.split()), validate=True)


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f"text ({value[:20]!r}{'...' if len(value) > 20 else ''})"
    return {dict: "an object", bool: "a boolean", list: "a list", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _expected(spec: InputSpec) -> str:
    if spec.kind == "image":
        return "a base64-encoded image as a JSON string"
    if spec.kind == "tensor":
        if spec.shape is None:
            return f"a (nested) list of {spec.dtype} numbers"
        per_row = spec.shape[1:]
        example = _example(per_row)
        row = f"rows of shape {per_row}" if len(per_row) != 1 else f"rows of {per_row[0]} numbers"
        return f"{spec.dtype} numbers with shape {spec.shape} ({row}), e.g. {example}"
    return "a JSON value"


def _example(shape: list[int]) -> str:
    if not shape:
        return "[1.0]"
    inner: Any = [0.5] * max(1, min(shape[-1], 4) if shape[-1] > 0 else 1)
    for dim in reversed(shape[:-1]):
        inner = [inner] * (dim if 0 < dim <= 2 else 1)
    return str([inner])


def squeeze_single(value: Any) -> Any:
    """Drop the batch dimension of a one-row result, as the seed services answered: ``[[a, b]] -> [a, b]``."""
    if isinstance(value, np.ndarray):
        return value[0] if value.ndim >= 1 and value.shape[0] == 1 else value
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    if isinstance(value, dict):
        return {key: squeeze_single(item) for key, item in value.items()}
    return value


def _fallback(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dump_json(value: Any) -> bytes:
    """Encode a prediction (NumPy arrays included) as every transport answers it: ``/predict``, the job queue and
    the offline scorer write the same bytes for the same output (float32 as float32, not widened)."""
    return orjson.dumps(value, default=_fallback, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def to_jsonable(value: Any) -> Any:
    """NumPy values -> plain Python, for encoders that do not know NumPy."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value
