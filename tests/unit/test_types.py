from __future__ import annotations

import pytest

from pipeserve.types import Signature, TensorSpec, numpy_dtype


@pytest.mark.parametrize(
    ("name", "expected"), [("tensor(float)", "float32"), ("FP16", "float16"), ("int64", "int64"), ("BYTES", "object")]
)
def test_numpy_dtype_names(name: str, expected: str) -> None:
    assert numpy_dtype(name).name == expected


def test_numpy_dtype_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown tensor dtype"):
        numpy_dtype("float33")


def test_signature_describes_itself() -> None:
    sig = Signature(inputs=(TensorSpec("x", "float32", (-1, 4)),), outputs=(TensorSpec("y", "int64"),))
    assert sig.input("x") == TensorSpec("x", "float32", (-1, 4))
    assert sig.input("z") is None
    assert sig.to_dict()["outputs"] == [{"name": "y", "datatype": "int64", "shape": None}]
    assert TensorSpec("y", "int64").describe() == "y: int64[?]"
