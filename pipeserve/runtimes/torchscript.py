"""TorchScript modules with PyTorch, on CPU or a CUDA device."""

from __future__ import annotations

import threading
import warnings
from typing import Any, ClassVar

import numpy as np

from pipeserve.errors import SpecError
from pipeserve.runtimes.base import Runtime
from pipeserve.types import Signature, TensorDict, TensorSpec


class TorchScriptRuntime(Runtime):
    """Runs a ``torch.jit`` module under ``torch.inference_mode()``.

    TorchScript files do not record dtypes or shapes, so declare them in the spec when you want them in
    the metadata: ``options: {inputs: [{name: input, dtype: float32, shape: [-1, 3, 224, 224]}],
    outputs: [{name: logits, dtype: float32, shape: [-1, 1000]}]}``. Without ``outputs`` the outputs are
    called ``output__0``, ``output__1``, ... (Triton's convention).
    """

    name: ClassVar[str] = "torchscript"
    computes_on_calling_thread: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._module: Any = None
        self._torch: Any = None
        self._device: Any = None
        self._input_names: list[str] = []
        self._output_names: list[str] = []
        self._thread = threading.local()

    def load(self) -> None:
        try:
            import torch
        except ImportError as exc:
            raise SpecError("runtime 'torchscript' needs PyTorch: pip install 'pipeserve[torch]'") from exc
        path = self.options.artifact
        if path is None:
            raise SpecError("runtime 'torchscript' needs an artifact path", field="artifact")
        torch.set_num_threads(self.options.intra_op_threads)
        if self.options.device.startswith("cuda") and not torch.cuda.is_available():
            raise SpecError(f"device {self.options.device!r} requested but CUDA is not available", field="devices")
        device = torch.device(self.options.device)
        try:
            with warnings.catch_warnings():
                # torch 2.13 deprecates TorchScript in favour of torch.export; loading still works and is what
                # this runtime is for. The warning would repeat in every worker for every model.
                warnings.filterwarnings(
                    "ignore", message=r".*torch\.jit\..* is deprecated", category=DeprecationWarning
                )
                module = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise SpecError(f"torch.jit.load cannot load {path}: {exc}", field="artifact") from exc
        module.eval()
        self._torch, self._device, self._module = torch, device, module
        declared_in = [_declared(d) for d in self.options.extra.get("inputs", [])]
        declared_out = [_declared(d) for d in self.options.extra.get("outputs", [])]
        schema_args = [a.name for a in module.forward.schema.arguments[1:]]
        inputs = declared_in or [TensorSpec(n, "float32", None) for n in schema_args]
        if len(inputs) != len(schema_args):
            raise SpecError(
                f"options.inputs declares {len(inputs)} inputs but forward() takes {len(schema_args)} ({schema_args})",
                field="options",
            )
        outputs = declared_out or [TensorSpec("output__0", "float32", None)]
        self._input_names = [s.name for s in inputs]
        self._output_names = [s.name for s in outputs]
        self._signature = Signature(inputs=tuple(inputs), outputs=tuple(outputs))

    def predict(self, inputs: TensorDict) -> TensorDict:
        torch = self._torch
        if not getattr(self._thread, "configured", False):
            # OpenMP's thread count is a per-thread setting: a worker thread that never set it runs every op on
            # one OpenMP thread per core, which oversubscribes a process given fewer cores than the machine has.
            torch.set_num_threads(self.options.intra_op_threads)
            self._thread.configured = True
        args = [torch.from_numpy(np.ascontiguousarray(inputs[name])).to(self._device) for name in self._input_names]
        with torch.inference_mode():
            out = self._module(*args)
        tensors = list(out) if isinstance(out, tuple | list) else [out]
        if len(tensors) != len(self._output_names):
            raise ValueError(f"module returned {len(tensors)} outputs, signature declares {len(self._output_names)}")
        return {name: t.detach().cpu().numpy() for name, t in zip(self._output_names, tensors, strict=True)}

    def unload(self) -> None:
        self._module = None


def _declared(item: Any) -> TensorSpec:
    if not isinstance(item, dict) or "name" not in item:
        raise SpecError(f"tensor declaration {item!r} needs at least a name", field="options")
    shape = item.get("shape")
    return TensorSpec(str(item["name"]), str(item.get("dtype", "float32")), tuple(shape) if shape else None)
