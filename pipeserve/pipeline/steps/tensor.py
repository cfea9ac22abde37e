"""Light tensor steps: softmax, top-k, label lookup."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from pipeserve.errors import InvalidInput, SpecError
from pipeserve.pipeline.context import request_params
from pipeserve.pipeline.steps.base import Step, StepParams


def _scores(value: Any, node: str) -> np.ndarray[Any, Any]:
    array = np.asarray(value)
    if array.dtype.kind not in "fiu" or array.ndim == 0:
        raise TypeError(f"step {node!r} needs a numeric array of scores, got {array.dtype} with shape {array.shape}")
    return array


class Softmax(Step):
    """Numerically stable softmax along ``axis`` (default: the last)."""

    class Params(StepParams):
        axis: int = -1

    is_cpu_heavy: ClassVar[bool] = False

    def __call__(self, value: Any) -> Any:
        params: Softmax.Params = self.params  # type: ignore[assignment]
        x = _scores(value, self.context.node).astype(np.float32, copy=False)
        shifted = np.exp(x - x.max(axis=params.axis, keepdims=True))
        return shifted / shifted.sum(axis=params.axis, keepdims=True)


class TopK(Step):
    """Scores ``[N, C]`` -> per row, the ``k`` best as ``[{"name": label, "prob": score}]``, best first."""

    class Params(StepParams):
        k: int = Field(default=5, ge=1)

    is_cpu_heavy: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.context.labels is None:
            raise SpecError("step 'top_k' needs pipeline.labels", node=self.context.node, field="step")

    def __call__(self, value: Any) -> Any:
        params: TopK.Params = self.params  # type: ignore[assignment]
        labels = self.context.labels or ()
        scores = np.atleast_2d(_scores(value, self.context.node))
        count = min(self._requested_k(len(labels)) or params.k, scores.shape[-1])
        # float64 first: negating unsigned scores (quantized models) would wrap around
        best = np.argsort(-scores.astype(np.float64), axis=-1, kind="stable")[:, :count]
        return [
            [{"name": labels[i], "prob": float(row[i])} for i in idx] for row, idx in zip(scores, best, strict=True)
        ]

    def _requested_k(self, limit: int) -> int | None:
        """The request's ``k`` (``?k=3``), checked: 1 <= k <= the number of labels."""
        raw = request_params.get().get("k")
        if raw is None:
            return None
        try:
            k = int(raw)
        except (TypeError, ValueError):
            raise InvalidInput(f"k is {raw!r}, not a whole number", expected=f"1 <= k <= {limit}") from None
        if not 1 <= k <= limit:
            raise InvalidInput(f"k is {k}", expected=f"1 <= k <= {limit}")
        return k


class Label(Step):
    """Scores ``[N, C]`` -> the label of the best class per row; integer class ids -> their labels."""

    is_cpu_heavy: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.context.labels is None:
            raise SpecError("step 'label' needs pipeline.labels", node=self.context.node, field="step")

    def __call__(self, value: Any) -> Any:
        labels = self.context.labels or ()
        array = _scores(value, self.context.node)
        ids = array.reshape(-1) if array.dtype.kind in "iu" else np.atleast_2d(array).argmax(axis=-1)
        return lookup_labels(labels, ids)


def lookup_labels(labels: tuple[str, ...], ids: Any) -> list[str]:
    """Class ids -> names; an id outside the labels is an error (model and labels out of step), never wrapped."""
    names = []
    for raw in ids:
        index = int(raw)
        if not 0 <= index < len(labels):
            raise ValueError(f"class id {index} is outside the {len(labels)} labels: model and labels are out of step")
        names.append(labels[index])
    return names
