"""A model node served elsewhere: the preprocessing server's stand-in for a model on a v2 inference server.

The pipeline knows only the ``RemoteInference`` protocol; the transport (gRPC or HTTP, endpoints, retries,
release checks) is ``pipeserve.remote``'s, injected by the composition root.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Protocol

import numpy as np

from pipeserve.errors import InvalidInput
from pipeserve.pipeline.nodes import named_tensors
from pipeserve.types import Signature, TensorDict, numpy_dtype
from pipeserve.v2.values import decode_value, encode_value

logger = logging.getLogger(__name__)


class RemoteInference(Protocol):
    """What a remote model node (and the service running it) needs from the transport."""

    async def start(self, release: str | None) -> None:
        """Connect and probe the endpoints; ``release`` is the fingerprint they must serve."""
        ...

    async def stop(self) -> None: ...

    def unavailable_reason(self) -> str | None:
        """None while some endpoint can serve; else why none can (shown by /health/ready)."""
        ...

    async def signature(self, model: str, version: str) -> Signature:
        """The model's inputs and outputs as an endpoint reports them (waits for an endpoint to come up)."""
        ...

    async def infer(self, model: str, version: str, inputs: TensorDict, outputs: list[str] | None) -> TensorDict:
        """Run one request on some healthy endpoint, within the request's deadline."""
        ...

    def describe(self) -> dict[str, Any]: ...


class RemoteModelNode:
    """Calls ``model`` (version ``version``) through a ``RemoteInference``; selects outputs like a local model."""

    kind: Literal["model"] = "model"
    is_async = True
    runs_inline = False
    queued = False

    def __init__(
        self,
        name: str,
        remote: RemoteInference,
        *,
        model: str,
        version: str,
        outputs: list[str] | None = None,
        request_outputs: list[str] | None = None,
        input_names: list[str] | None = None,
        values: bool = False,
    ) -> None:
        self.name = name
        self.remote = remote
        self.model = model
        self.version = version
        self._selected = outputs
        self._request_outputs = request_outputs or outputs
        self._input_names = input_names or []
        self._casts: dict[str, np.dtype[Any]] = {}
        self.signature: Signature | None = None
        #: A handler served elsewhere: any value travels as tensors (``pipeserve.v2.values``), not a model input.
        self.values = values

    @property
    def selected_outputs(self) -> list[str] | None:
        """The outputs the node passes on (``outputs`` in the spec), or None for all."""
        return self._selected

    def load(self) -> None:
        return None

    async def start(self) -> None:
        """Learn the model's inputs from an endpoint (its metadata), to name and cast what the pipeline sends."""
        self.signature = await self.remote.signature(self.model, self.version)
        if not self._input_names:
            self._input_names = [spec.name for spec in self.signature.inputs] or ["input-0"]
        for spec in self.signature.inputs:
            try:
                dtype = numpy_dtype(spec.dtype)
            except ValueError:
                continue
            if dtype.kind in "biuf":
                self._casts[spec.name] = dtype

    def call(self, value: Any) -> Any:
        raise RuntimeError(f"remote model node {self.name!r} is awaited, never called synchronously")

    async def acall(self, value: Any) -> Any:
        if self.values:
            return decode_value(await self.remote.infer(self.model, self.version, encode_value(value), None))
        outputs = await self.remote.infer(self.model, self.version, self._inputs(value), self._request_outputs)
        if self._selected is None:
            return next(iter(outputs.values())) if len(outputs) == 1 else outputs
        missing = [n for n in self._selected if n not in outputs]
        if missing:
            raise InvalidInput(f"the inference server's answer for {self.model!r} lacks outputs {missing}")
        if len(self._selected) == 1:
            return outputs[self._selected[0]]
        return {name: outputs[name] for name in self._selected}

    def _inputs(self, value: Any) -> TensorDict:
        return named_tensors(self.name, value, self._input_names, self._casts)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "name": self.name,
            "kind": "model",
            "served_by": "remote v2 inference server" + (" (a handler)" if self.values else ""),
            "model": self.model,
            "version": self.version,
            **self.remote.describe(),
        }
        if self.signature is not None:
            info.update(self.signature.to_dict())
        return info
