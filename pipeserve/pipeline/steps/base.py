"""The step contract and the registry of built-in steps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeserve._importer import import_from_string
from pipeserve.errors import SpecError

STEPS: dict[str, str] = {
    "image.decode": "pipeserve.pipeline.steps.image:Decode",
    "image.resize": "pipeserve.pipeline.steps.image:Resize",
    "image.center_crop": "pipeserve.pipeline.steps.image:CenterCrop",
    "image.to_tensor": "pipeserve.pipeline.steps.image:ToTensor",
    "image.normalize": "pipeserve.pipeline.steps.image:Normalize",
    "softmax": "pipeserve.pipeline.steps.tensor:Softmax",
    "top_k": "pipeserve.pipeline.steps.tensor:TopK",
    "label": "pipeserve.pipeline.steps.tensor:Label",
}


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a step may need from its pipeline besides its own parameters."""

    node: str
    base_dir: Path
    labels: tuple[str, ...] | None = None


class StepParams(BaseModel):
    """Base of each step's parameter model; unknown parameters are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Step:
    """A built-in step: a pure function of one request's value, configured by ``Params``.

    Subclasses set ``Params`` and ``is_cpu_heavy`` (heavy steps run in a worker thread; light ones, a few
    microseconds of NumPy, run inline) and implement ``__call__``.
    """

    Params: ClassVar[type[StepParams]] = StepParams
    is_cpu_heavy: ClassVar[bool] = False

    def __init__(self, params: StepParams, context: StepContext) -> None:
        self.params = params
        self.context = context

    def __call__(self, value: Any) -> Any:
        raise NotImplementedError


def create_step(name: str, params: dict[str, Any], context: StepContext, *, file: str | None = None) -> Step:
    """Build the built-in step ``name`` (or a ``pkg.mod:Class`` Step subclass) with validated ``params``."""
    target = STEPS.get(name, name if ":" in name else None)
    if target is None:
        raise SpecError(
            f"unknown step {name!r}; built-in steps: {', '.join(STEPS)}", file=file, node=context.node, field="step"
        )
    cls = import_from_string(target)
    if not (isinstance(cls, type) and issubclass(cls, Step)):
        raise SpecError(f"{target!r} is not a pipeserve Step", file=file, node=context.node, field="step")
    try:
        parsed = cls.Params.model_validate(params)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise SpecError(
            f"{err['msg'].removeprefix('Value error, ')} (step {name!r})",
            file=file,
            node=context.node,
            field=f"params.{where}" if where else "params",
        ) from exc
    try:
        return cls(parsed, context)
    except SpecError as exc:
        raise SpecError(exc.problem, file=file, node=context.node, field=exc.field or "params") from exc
    except ValueError as exc:
        raise SpecError(f"{exc} (step {name!r})", file=file, node=context.node, field="params") from exc
