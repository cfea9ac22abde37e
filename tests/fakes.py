"""Fake runtimes for tests that are about pipeserve, not about an ML engine."""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

import numpy as np

from pipeserve.runtimes.base import Runtime
from pipeserve.types import Signature, TensorDict, TensorSpec


class _Fake(Runtime):
    name: ClassVar[str] = "fake"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []
        self.seen: list[float] = []  # the first column of every row run, to tell which requests ran
        self.batch_rows: list[list[float]] = []  # the same, batch by batch
        self.threads: list[str] = []  # the thread each batch ran on
        self._lock = threading.Lock()

    def load(self) -> None:
        self._signature = Signature(
            inputs=(TensorSpec("input", "float32", (-1, -1)),), outputs=(TensorSpec("output", "float32", (-1, -1)),)
        )

    def _record(self, inputs: TensorDict) -> None:
        with self._lock:
            self.batches.append(int(inputs["input"].shape[0]))
            rows = [float(v) for v in np.asarray(inputs["input"])[:, 0]]
            self.seen.extend(rows)
            self.batch_rows.append(rows)
            self.threads.append(threading.current_thread().name)


class EchoRuntime(_Fake):
    """Returns its input."""

    def predict(self, inputs: TensorDict) -> TensorDict:
        self._record(inputs)
        return {"output": inputs["input"].copy()}


class SumRuntime(_Fake):
    """Returns the sum of each row, as a column."""

    def load(self) -> None:
        super().load()
        self._signature = Signature(
            inputs=(TensorSpec("input", "float32", (-1, -1)),), outputs=(TensorSpec("output", "float32", (-1, 1)),)
        )

    def predict(self, inputs: TensorDict) -> TensorDict:
        self._record(inputs)
        return {"output": inputs["input"].sum(axis=1, keepdims=True)}


class FailingRuntime(_Fake):
    """Raises on every batch (after load), or on rows holding ``options.extra['poison']``, or (MemoryError) on
    batches of more rows than ``options.extra['fail_above']``."""

    def predict(self, inputs: TensorDict) -> TensorDict:
        self._record(inputs)
        fail_above = self.options.extra.get("fail_above")
        if fail_above is not None:
            if len(inputs["input"]) > int(fail_above):
                raise MemoryError(f"{len(inputs['input'])} rows do not fit")
            return {"output": inputs["input"].copy()}
        poison = self.options.extra.get("poison")
        if poison is None or (inputs["input"] == poison).any():
            raise ValueError("boom: the engine failed")
        return {"output": inputs["input"].copy()}


class SlowRuntime(_Fake):
    """Echo after sleeping ``options.extra['delay_s']`` (default 50 ms) per batch, or per row with ``per_row``."""

    def predict(self, inputs: TensorDict) -> TensorDict:
        self._record(inputs)
        rows = len(inputs["input"]) if self.options.extra.get("per_row") else 1
        time.sleep(float(self.options.extra.get("delay_s", 0.05)) * rows)
        return {"output": np.array(inputs["input"], copy=True)}


class SleepOnCallingThreadRuntime(SlowRuntime):
    """Claims to compute on the calling thread (as ONNX Runtime and TorchScript with one thread do), but sleeps:
    its CPU time is ~0, which shows that such a runtime is costed by CPU time, not by the clock."""

    computes_on_calling_thread: ClassVar[bool] = True
