"""Built-in pipeline steps, named in specs by ``step:``."""

from pipeserve.pipeline.steps.base import STEPS, Step, StepContext, create_step

__all__ = ["STEPS", "Step", "StepContext", "create_step"]
