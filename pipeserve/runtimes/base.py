"""The contract every model runtime fulfils."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pipeserve.types import Signature, TensorDict


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """What a runtime is told at construction: where the artifact is and how to run it.

    ``intra_op_threads`` and ``inter_op_threads`` bound the engine's own thread pools (1 and 1 by default:
    one serving process per core scales better than one process fighting for all of them).
    """

    artifact: Path | None
    device: str = "cpu"
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)
    base_dir: Path = Path(".")


class Runtime(abc.ABC):
    """Loads one model artifact and runs batches of named tensors (leading dimension = batch).

    Lifecycle: ``load()`` once (off the event loop), then any number of ``predict()`` calls, possibly from
    several threads when ``is_thread_safe``, then ``unload()``. Heavy libraries are imported in ``load()``.

    Example:
        >>> rt = create_runtime("onnx", RuntimeOptions(artifact=Path("iris.onnx")))  # doctest: +SKIP
        >>> rt.load(); rt.predict({"input": x})["probabilities"]                     # doctest: +SKIP
    """

    #: The name used in specs (``runtime: onnx``).
    name: ClassVar[str]
    #: The engine releases the GIL while it computes, so running it in threads gives real concurrency.
    releases_gil: ClassVar[bool] = True
    #: ``predict`` may be called from several threads at once.
    is_thread_safe: ClassVar[bool] = True
    #: With ``intra_op_threads`` 1 the engine computes on the calling thread, so that thread's CPU time is the
    #: batch's cost (time-sharing a core does not inflate it, as it does wall time). False for runtimes that may
    #: wait on I/O or compute in threads of their own; they are timed by the clock.
    computes_on_calling_thread: ClassVar[bool] = False

    def __init__(self, options: RuntimeOptions) -> None:
        self.options = options
        self._signature: Signature | None = None

    @abc.abstractmethod
    def load(self) -> None:
        """Load the artifact; after this, ``signature`` is known. Raise ``SpecError`` if it cannot load."""

    @abc.abstractmethod
    def predict(self, inputs: TensorDict) -> TensorDict:
        """Run one batch. Every input and output has the batch as its leading dimension."""

    def unload(self) -> None:  # noqa: B027 - optional hook, most runtimes just drop references
        """Release the model's memory."""

    @property
    def signature(self) -> Signature:
        """The artifact's inputs and outputs, as it declares them."""
        if self._signature is None:
            raise RuntimeError(f"{type(self).__name__}.signature is only known after load()")
        return self._signature

    @property
    def is_loaded(self) -> bool:
        return self._signature is not None

    def describe(self) -> dict[str, Any]:
        """Facts for ``/metadata``."""
        info: dict[str, Any] = {"runtime": self.name, "device": self.options.device}
        if self.options.artifact is not None:
            info["artifact"] = str(self.options.artifact)
        if self._signature is not None:
            info.update(self._signature.to_dict())
        return info
