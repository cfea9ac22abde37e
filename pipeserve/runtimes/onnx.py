"""ONNX Runtime: one ``InferenceSession`` per model, CPU or CUDA execution provider."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pipeserve.errors import SpecError
from pipeserve.runtimes.base import Runtime
from pipeserve.types import Signature, TensorDict, TensorSpec, numpy_dtype


class OnnxRuntime(Runtime):
    """Runs an ``.onnx`` file with ONNX Runtime.

    Options (``model_load_meta.options``): ``graph_optimization`` (``all`` by default, or ``basic``,
    ``extended``, ``disabled``). Threads come from ``intra_op_threads`` / ``inter_op_threads``.
    """

    name: ClassVar[str] = "onnx"
    computes_on_calling_thread: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._session: Any = None
        self._output_names: list[str] = []

    def load(self) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise SpecError("runtime 'onnx' needs onnxruntime: pip install 'pipeserve[onnx]'") from exc
        path = self.options.artifact
        if path is None:
            raise SpecError("runtime 'onnx' needs an artifact path", field="artifact")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.options.intra_op_threads
        opts.inter_op_num_threads = self.options.inter_op_threads
        level = str(self.options.extra.get("graph_optimization", "all"))
        levels = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }
        if level not in levels:
            raise SpecError(f"graph_optimization {level!r} is not one of {', '.join(levels)}", field="options")
        opts.graph_optimization_level = levels[level]
        providers = ["CPUExecutionProvider"]
        if self.options.device.startswith("cuda"):
            device_id = int(self.options.device.partition(":")[2] or 0)
            providers = [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]  # type: ignore[list-item]
        try:
            session = ort.InferenceSession(str(path), opts, providers=providers)
        except Exception as exc:
            raise SpecError(f"onnxruntime cannot load {path}: {exc}", field="artifact") from exc
        self._session = session
        self._output_names = [o.name for o in session.get_outputs()]
        self._signature = Signature(
            inputs=tuple(_spec(i) for i in session.get_inputs()),
            outputs=tuple(_spec(o) for o in session.get_outputs()),
        )

    def predict(self, inputs: TensorDict) -> TensorDict:
        outputs = self._session.run(self._output_names, inputs)
        return dict(zip(self._output_names, outputs, strict=True))

    def unload(self) -> None:
        self._session = None


def _spec(arg: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape) if arg.shape is not None else None
    try:
        dtype = np.dtype(numpy_dtype(arg.type)).name
    except ValueError:
        dtype = str(arg.type)
    return TensorSpec(arg.name, dtype, shape)
