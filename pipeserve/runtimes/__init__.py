"""Model runtimes: each loads one artifact and runs a batch of named tensors."""

from pipeserve.runtimes.base import Runtime, RuntimeOptions
from pipeserve.runtimes.registry import RUNTIMES, create_runtime

__all__ = ["RUNTIMES", "Runtime", "RuntimeOptions", "create_runtime"]
