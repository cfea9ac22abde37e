"""A user class as a model: ``load(artifact_path)`` and ``predict(inputs) -> outputs`` over named tensors."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from pipeserve._importer import ImportFromStringError, import_from_string, import_handler_module
from pipeserve.errors import SpecError
from pipeserve.runtimes.base import Runtime
from pipeserve.types import Signature, TensorDict, TensorSpec


class PythonRuntime(Runtime):
    """Wraps a user model class named by ``options.class`` (``module:Class``, module relative to the spec dir).

    The class is instantiated with no arguments; ``load(artifact)`` is called if it exists (``artifact`` is a
    ``Path`` or ``None``); ``predict(inputs: dict[str, ndarray]) -> dict[str, ndarray]`` runs a batch. It may
    declare ``signature`` as a ``pipeserve.Signature``; otherwise inputs/outputs come from ``options``.
    """

    name: ClassVar[str] = "python"
    releases_gil: ClassVar[bool] = False
    is_thread_safe: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._model: Any = None

    def load(self) -> None:
        target = self.options.extra.get("class")
        if not isinstance(target, str):
            raise SpecError("runtime 'python' needs options.class = 'module:Class'", field="options")
        module_name, _, attr = target.partition(":")
        try:
            cls = getattr(import_handler_module(module_name, self.options.base_dir), attr) if attr else None
            if cls is None:
                cls = import_from_string(target)
        except (ImportFromStringError, AttributeError) as exc:
            raise SpecError(f"cannot import model class {target!r}: {exc}", field="options") from exc
        if not inspect.isclass(cls) or not callable(getattr(cls, "predict", None)):
            raise SpecError(f"{target!r} must be a class with a predict(inputs) method", field="options")
        model: Any = cls()
        if callable(getattr(model, "load", None)):
            model.load(self.options.artifact)
        self._model = model
        declared = getattr(model, "signature", None)
        if isinstance(declared, Signature):
            self._signature = declared
        else:
            ins = [
                TensorSpec(str(d["name"]), str(d.get("dtype", "float32")), None)
                for d in self.options.extra.get("inputs", [])
            ]
            outs = [
                TensorSpec(str(d["name"]), str(d.get("dtype", "float32")), None)
                for d in self.options.extra.get("outputs", [])
            ]
            self._signature = Signature(
                inputs=tuple(ins or [TensorSpec("input", "float32")]),
                outputs=tuple(outs or [TensorSpec("output", "float32")]),
            )

    def predict(self, inputs: TensorDict) -> TensorDict:
        result = self._model.predict(inputs)
        if not isinstance(result, dict):
            raise TypeError(
                f"{type(self._model).__name__}.predict must return dict[str, ndarray], got {type(result).__name__}"
            )
        return result

    def unload(self) -> None:
        self._model = None
