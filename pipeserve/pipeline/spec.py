"""The YAML pipeline format, as pydantic models.

The minimal format (DESIGN.md appendix) is a chain of Python handlers::

    pipeline:
      name: test_pipeline
      start_node_name: m1
      nodes:
      - name: m1
        model_load_meta:
          handler_module: m1.dummy_python_model
        next: m3

Everything else is optional: model nodes (``model_load_meta.runtime`` + ``artifact``), built-in steps
(``step``), batching, the input format, labels, a sample input and its golden output.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeserve.batching.policy import BATCH_OVERHEAD_S
from pipeserve.runtimes.devices import check_device

_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
_RESERVED_ENDPOINTS = frozenset({"predict", "test", "label"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorDecl(_Strict):
    """A tensor declared in the spec (for runtimes whose artifacts do not record their signature)."""

    name: str
    dtype: str = "float32"
    shape: list[int] | None = None


class RemoteSpec(_Strict):
    """How a preprocessing server (``pipeserve serve --infer URL``) calls this model on a v2 inference server.

    Defaults fit a pipeserve inference server serving the same spec: the node's name and version, its outputs.
    """

    url: list[str] | None = Field(
        default=None,
        description="Where the node is served (grpc://HOST:PORT or http://HOST:PORT, one or several): a gateway "
        "(`pipeserve serve --pattern gateway`) calls it there; other patterns run the node in-process.",
    )
    model: str | None = Field(default=None, description="Model name on the inference server; default: the node name.")
    version: str | None = Field(default=None, description="Model version; default: model_load_meta.version.")
    inputs: list[str] | None = Field(default=None, description="Input names, when the server's metadata has none.")
    outputs: list[str] | None = Field(
        default=None, description="Outputs to request (and pass on); default: model_load_meta.outputs, else all."
    )

    @field_validator("version", mode="before")
    @classmethod
    def _version_str(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value

    @field_validator("url", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        for url in value or []:
            if not re.fullmatch(r"(grpc|http)://[^/:\s]+:\d{1,5}", str(url)):
                raise ValueError(f"url {url!r} is not grpc://HOST:PORT or http://HOST:PORT")
        return value


class ModelLoadMeta(_Strict):
    """How to load a node: a Python handler, or a model runtime with its artifact."""

    handler_module: str | None = Field(
        default=None, description="Python module with the node's handler, relative to the spec dir ('pkg.mod[:attr]')."
    )
    runtime: str | None = Field(default=None, description="onnx | torchscript | sklearn | python | 'pkg.mod:Class'.")
    artifact: str | None = Field(default=None, description="Model file, relative to the spec dir.")
    version: str = Field(default="1", description="Model version, reported in metadata.")
    outputs: list[str] | None = Field(
        default=None, description="Which model outputs the node passes on; one name passes the bare tensor."
    )
    intra_op_threads: int = Field(default=1, ge=1, le=256)
    inter_op_threads: int = Field(default=1, ge=1, le=256)
    device: str = "cpu"
    devices: list[str] | None = Field(
        default=None, description="Devices to spread the replicas over, round-robin (overrides device)."
    )
    replicas: int = Field(default=1, ge=1, le=64, description="Copies of the model; each runs one batch at a time.")
    execution: Literal["auto", "thread", "inline"] = Field(
        default="auto",
        description="Where the engine runs: a worker thread, or the event loop for models faster than a thread "
        "hop (auto: decided from the warm-up runs).",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="Runtime-specific options.")
    remote: RemoteSpec = Field(default_factory=RemoteSpec, description="How a preprocessing server calls it.")

    @field_validator("version", mode="before")
    @classmethod
    def _version_str(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return check_device(value)

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("devices, when given, names at least one device")
        return None if value is None else [check_device(device) for device in value]

    @model_validator(mode="after")
    def _one_kind(self) -> ModelLoadMeta:
        if self.runtime is None and self.handler_module is None:
            raise ValueError("needs either handler_module (a Python handler) or runtime + artifact (a model)")
        if self.runtime not in (None, "python") and self.artifact is None:
            raise ValueError(f"runtime {self.runtime!r} needs an artifact path")
        return self


class BatchingSpec(_Strict):
    """Micro-batching for a model node. Off unless given."""

    max_batch_size: int = Field(default=32, ge=1, le=65536)
    max_latency_ms: float = Field(
        default=0.0,
        ge=0,
        le=60_000,
        description="The most the first request of a batch waits for others; "
        "0 = run what is queued the moment a replica is free.",
    )
    max_queue_size: int = Field(default=1024, ge=1, description="Requests waiting beyond this get 503.")
    mode: Literal["fixed", "adaptive"] = Field(
        default="fixed",
        description="fixed: wait up to max_latency_ms for a full batch. adaptive: wait only while "
        "the next request is expected sooner than the compute its joining saves (learned), at most max_latency_ms.",
    )
    batch_overhead_ms: float = Field(
        default=BATCH_OVERHEAD_S * 1000,
        ge=0,
        le=10_000,
        description="adaptive: what one batch costs the server beyond the model's run (waking the batcher, "
        "splitting, answering, caches the model evicted), added to each batch's measured time when batch sizes are "
        "compared per row. 0 compares the model's time alone.",
    )


class NodeSpec(_Strict):
    """One pipeline node: a handler or model (``model_load_meta``), or a built-in ``step``."""

    name: str = Field(pattern=_NAME_PATTERN)
    model_load_meta: ModelLoadMeta | None = None
    step: str | None = Field(default=None, description="A built-in step, e.g. image.decode, softmax, top_k.")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters of the step or handler.")
    next: str | None = Field(default=None, description="The node after this one; default: the next node listed.")
    inputs: list[str] | dict[str, str] | None = Field(
        default=None,
        description="Nodes whose outputs this node takes ($input = the request), instead of the node before it: "
        "one name passes that output, several a dict by node name, a mapping a dict under its keys.",
    )
    batching: BatchingSpec | None = None
    optional: bool = Field(
        default=False,
        description="When this node fails, the request goes on without it: nodes that take its output get None, "
        "and the response lists it under `skipped`. Default: a failing node fails the request.",
    )

    @field_validator("inputs")
    @classmethod
    def _some_inputs(cls, value: list[str] | dict[str, str] | None) -> list[str] | dict[str, str] | None:
        if value is not None and len(value) == 0:
            raise ValueError("inputs, when given, names at least one node (or $input)")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> NodeSpec:
        if (self.model_load_meta is None) == (self.step is None):
            raise ValueError("a node needs exactly one of model_load_meta (handler or model) or step (built-in)")
        if self.batching is not None and (self.model_load_meta is None or self.model_load_meta.runtime is None):
            raise ValueError("batching applies to model nodes (model_load_meta.runtime) only")
        return self

    @property
    def kind(self) -> Literal["model", "handler", "step"]:
        if self.step is not None:
            return "step"
        assert self.model_load_meta is not None
        return "model" if self.model_load_meta.runtime is not None else "handler"


class InputSpec(_Strict):
    """What ``data`` a request carries.

    ``json``: any JSON value, handed to the first node as is. ``tensor``: numbers, converted to an array of
    ``dtype`` and checked against ``shape`` (``-1`` = any; a missing leading batch dimension is added).
    ``image``: a base64 string (or an upload) of an encoded image, handed on as bytes.
    """

    kind: Literal["json", "tensor", "image"] = "json"
    dtype: str = "float32"
    shape: list[int] | None = None
    max_batch_rows: int = Field(default=64, ge=1, description="Rows one tensor request may carry.")


class SampleSpec(_Strict):
    """A sample request: inline ``data`` (as sent in ``{"data": ...}``) or a ``file`` (raw bytes, for images)."""

    data: Any = None
    file: str | None = None

    @model_validator(mode="after")
    def _one(self) -> SampleSpec:
        if (self.data is None) == (self.file is None):
            raise ValueError("a sample needs exactly one of data or file")
        return self


class GoldenSpec(_Strict):
    """What the sample must produce: a ``prediction`` (inline or from ``prediction_file``) and/or a ``label``."""

    prediction: Any = None
    prediction_file: str | None = None
    label: Any = None
    atol: float = Field(default=1e-4, ge=0)
    rtol: float = Field(default=1e-3, ge=0)


class PipelineSpec(_Strict):
    """The ``pipeline:`` section."""

    name: str = Field(pattern=_NAME_PATTERN)
    start_node_name: str | None = None
    nodes: list[NodeSpec] = Field(min_length=1)
    version: str = "1"
    description: str = ""
    input: InputSpec = Field(default_factory=InputSpec)
    labels: list[str] | str | None = Field(default=None, description="Class names, inline or a file (one per line).")
    sample: SampleSpec | None = None
    golden: GoldenSpec | None = None
    output: str | None = Field(
        default=None,
        description="The node whose output POST /predict answers; default: "
        "the last node of the chain from the start node.",
    )
    endpoints: dict[str, str] = Field(
        default_factory=dict,
        description="More prediction endpoints: POST /predict/<name> answers the named node's output.",
    )

    @field_validator("endpoints")
    @classmethod
    def _endpoint_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name) or name in _RESERVED_ENDPOINTS:
                raise ValueError(
                    f"endpoint name {name!r} must be lowercase letters, digits, _ or - (and not one of "
                    f"{', '.join(sorted(_RESERVED_ENDPOINTS))})"
                )
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_str(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value


class SpecFile(_Strict):
    """The whole YAML document."""

    pipeline: PipelineSpec
