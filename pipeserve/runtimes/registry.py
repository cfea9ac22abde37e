"""Runtime names used in specs, mapped to import strings resolved on first use."""

from __future__ import annotations

from pipeserve._importer import ImportFromStringError, import_from_string
from pipeserve.errors import SpecError
from pipeserve.runtimes.base import Runtime, RuntimeOptions

RUNTIMES: dict[str, str] = {
    "onnx": "pipeserve.runtimes.onnx:OnnxRuntime",
    "torchscript": "pipeserve.runtimes.torchscript:TorchScriptRuntime",
    "sklearn": "pipeserve.runtimes.sklearn:SklearnRuntime",
    "python": "pipeserve.runtimes.python:PythonRuntime",
}


def runtime_class(name: str) -> type[Runtime]:
    """The class registered for ``name``; a custom runtime may be named by import string ``pkg.mod:Class``."""
    target = RUNTIMES.get(name, name if ":" in name else None)
    if target is None:
        raise SpecError(
            f"unknown runtime {name!r}; expected one of {', '.join(sorted(RUNTIMES))} or 'package.module:Class'"
        )
    try:
        cls = import_from_string(target)
    except ImportFromStringError as exc:
        extra = {"onnx": "onnx", "torchscript": "torch", "sklearn": "sklearn"}.get(name)
        hint = f" (install it with: pip install 'pipeserve[{extra}]')" if extra else ""
        raise SpecError(f"runtime {name!r} is not available: {exc}{hint}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise SpecError(f"{target!r} is not a pipeserve Runtime subclass")
    return cls


def create_runtime(name: str, options: RuntimeOptions) -> Runtime:
    """Build (not load) the runtime called ``name``."""
    return runtime_class(name)(options)
