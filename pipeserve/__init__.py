"""pipeserve: serve ML pipelines (preprocessing -> model -> postprocessing, or a DAG of models).

Nothing heavy is imported here; runtimes import their engines when they load a model.
"""

from pipeserve.batching import Batcher, BatchPolicy
from pipeserve.config import ServerSettings
from pipeserve.errors import (
    DeadlineExceeded,
    GoldenCheckFailed,
    InvalidInput,
    NodeFailed,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    PipeserveError,
    SpecError,
)
from pipeserve.pipeline.executor import Pipeline
from pipeserve.pipeline.handlers import Handler, HandlerContext
from pipeserve.pipeline.loader import LoadedSpec, load_spec
from pipeserve.runtimes import Runtime, RuntimeOptions
from pipeserve.service import InferenceService
from pipeserve.types import Signature, TensorSpec

__version__ = "0.1.0"

__all__ = [
    "BatchPolicy",
    "Batcher",
    "DeadlineExceeded",
    "GoldenCheckFailed",
    "Handler",
    "HandlerContext",
    "InferenceService",
    "InvalidInput",
    "LoadedSpec",
    "NodeFailed",
    "NotFound",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "Pipeline",
    "PipeserveError",
    "Runtime",
    "RuntimeOptions",
    "ServerSettings",
    "Signature",
    "SpecError",
    "TensorSpec",
    "__version__",
    "load_spec",
]
