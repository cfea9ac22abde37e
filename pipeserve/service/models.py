"""ModelService: the models of a release, by name and version, for the inference servers (v2 HTTP and gRPC).

Models come from a model repository. ``ModelRepository.from_spec`` takes a pipeline spec's model nodes (name =
node name, version = ``model_load_meta.version``): the inference server of the preprocessing-inference split,
serving exactly the release its preprocessing server was built from. ``ModelRepository.from_directory`` reads
Triton's layout, ``REPO/NAME/VERSION/model.<onnx|pt|joblib>`` with an optional ``REPO/NAME/config.yaml``
(the ``model_load_meta`` fields plus ``batching``), for models without a pipeline.

Every model reports a fingerprint in its metadata: the release fingerprint of its spec (the same one the
preprocessing server computes), or for a repository model the digest of its version folder.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import yaml
from pydantic import ValidationError

from pipeserve.batching import BatchPolicy
from pipeserve.errors import InvalidInput, NotFound, NotReady, SpecError
from pipeserve.pipeline.executor import build_model_node, default_worker_threads
from pipeserve.pipeline.handlers import HandlerContext, resolve_handler
from pipeserve.pipeline.loader import LoadedSpec
from pipeserve.pipeline.nodes import HandlerNode, ModelNode
from pipeserve.pipeline.release import fingerprint
from pipeserve.pipeline.spec import BatchingSpec, ModelLoadMeta, NodeSpec
from pipeserve.runtimes import Runtime, RuntimeOptions
from pipeserve.service.limits import Admission
from pipeserve.types import Signature, TensorDict, numpy_dtype
from pipeserve.v2 import RELEASE_PARAMETER
from pipeserve.v2.datatypes import datatype_of
from pipeserve.v2.values import decode_value, encode_value

if TYPE_CHECKING:
    from pipeserve.observability.metrics import Metrics

logger = logging.getLogger(__name__)

#: Runtime by artifact suffix, for repository folders without a config.yaml.
_RUNTIME_BY_SUFFIX = {".onnx": "onnx", ".pt": "torchscript", ".ts": "torchscript", ".joblib": "sklearn"}


@dataclass
class ModelEntry:
    """One version of one model in the repository, and its state (READY, UNAVAILABLE, LOADING, UNLOADING)."""

    name: str
    version: str
    build: Callable[[], ModelNode]
    fingerprint: Callable[[], str]
    source: str
    node: ModelNode | None = None
    state: str = "UNAVAILABLE"
    reason: str = "not loaded"
    release: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ModelRepository:
    """Model name -> version -> how to build it."""

    def __init__(self, entries: list[ModelEntry], *, description: str) -> None:
        self.description = description
        self.models: dict[str, dict[str, ModelEntry]] = {}
        for entry in entries:
            versions = self.models.setdefault(entry.name, {})
            if entry.version in versions:
                raise SpecError(f"model {entry.name!r} version {entry.version} is declared twice")
            versions[entry.version] = entry
        #: Each model's highest version (what a request naming no version gets).
        self.latest = {name: versions[max(versions, key=_version_key)] for name, versions in self.models.items()}

    @classmethod
    def from_spec(cls, loaded: LoadedSpec, *, only: Sequence[str] | None = None) -> ModelRepository:
        """The model nodes of a pipeline spec (``only``: just these nodes, handlers included), each behind its
        batcher (even without batching: FIFO, bounded, deadlines).

        Raises:
            SpecError: no model nodes, or ``only`` names a node that is not a model.
        """
        release = functools.cache(lambda: fingerprint(loaded))
        servable = [n.name for n in loaded.spec.nodes if n.model_load_meta is not None]
        unknown = [name for name in only or [] if name not in servable]
        if unknown:
            raise SpecError(
                f"--models {unknown} are not model or handler nodes (those are: {', '.join(servable)})",
                file=loaded.path,
            )
        entries = []
        for node in loaded.spec.nodes:
            meta = node.model_load_meta
            if meta is not None and meta.runtime is None and only and node.name in only:
                entries.append(_handler_entry(loaded, node, release))  # a handler served as a v2 "model"
                continue
            if meta is None or meta.runtime is None or node.name in loaded.graph.unreachable:
                continue
            if only and node.name not in only:
                continue
            artifact = loaded.resolve(meta.artifact) if meta.artifact else None
            entries.append(
                ModelEntry(
                    node.name,
                    meta.version,
                    _builder(node.name, meta, node.batching, loaded.base_dir, artifact, str(loaded.path)),
                    release,
                    source=f"{loaded.path} node {node.name!r}",
                )
            )
        if not entries:
            raise SpecError("the pipeline has no model nodes to serve", file=loaded.path)
        return cls(entries, description=f"pipeline {loaded.spec.name!r} ({loaded.path})")

    @classmethod
    def from_directory(cls, root: Path) -> ModelRepository:
        """Triton's layout: ``NAME/VERSION/`` folders (numeric versions) holding one model file each.

        Raises:
            SpecError: a folder without a model file, an unknown suffix, or an invalid config.yaml.
        """
        root = root.resolve()
        if not root.is_dir():
            raise SpecError(f"model repository {root} is not a directory")
        entries = []
        for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            config = _read_config(model_dir)
            batching = config.pop("batching", None)
            versions = sorted(
                (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
            )
            for version_dir in versions:
                artifact, runtime = _find_artifact(version_dir, config.get("runtime"))
                try:
                    meta = ModelLoadMeta(
                        **{**config, "runtime": runtime, "artifact": str(artifact), "version": version_dir.name}
                    )
                    batching_spec = BatchingSpec(**batching) if batching is not None else None
                except ValidationError as exc:
                    raise SpecError(
                        f"invalid config: {exc.errors()[0]['msg']}", file=model_dir / "config.yaml"
                    ) from None
                entries.append(
                    ModelEntry(
                        model_dir.name,
                        version_dir.name,
                        _builder(model_dir.name, meta, batching_spec, version_dir, artifact, str(model_dir)),
                        functools.cache(functools.partial(_digest, version_dir)),
                        source=str(version_dir),
                    )
                )
        if not entries:
            raise SpecError(f"model repository {root} has no NAME/VERSION/ model folders")
        return cls(entries, description=f"model repository {root}")


class ModelService:
    """Loads the repository's models, warms them up, and runs v2 inference requests through their batchers.

    Example:
        >>> service = ModelService(ModelRepository.from_spec(load_spec("examples/iris")))  # doctest: +SKIP
        >>> await service.start()                                                          # doctest: +SKIP
        >>> await service.infer("classifier", "", {"input": x})                            # doctest: +SKIP
    """

    def __init__(
        self,
        repository: ModelRepository,
        *,
        metrics: Metrics | None = None,
        warmup_runs: int = 3,
        worker_threads: int | None = None,
        max_in_flight: int = 512,
        server_name: str = "pipeserve",
        server_version: str = "",
    ) -> None:
        self.repository = repository
        self.metrics = metrics
        self.warmup_runs = warmup_runs
        self.server_name = server_name
        self.server_version = server_version
        self.started = False
        self._admission = Admission(max_in_flight)
        self._pool = ThreadPoolExecutor(max_workers=worker_threads or default_worker_threads(), thread_name_prefix="v2")
        self._single_core = (worker_threads or default_worker_threads()) == 1

    # -- lifecycle -------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every model. One that fails stays UNAVAILABLE with its reason (and the server unready); others serve."""
        for versions in self.repository.models.values():
            for entry in versions.values():
                await self._load(entry)
        self.started = True

    async def stop(self, grace_s: float = 5.0) -> None:
        for versions in self.repository.models.values():
            for entry in versions.values():
                await self._unload(entry, grace_s)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.started = False

    @property
    def in_flight(self) -> int:
        """Inference requests started and not yet answered."""
        return self._admission.in_flight

    @property
    def is_ready(self) -> bool:
        """Started, and every model in the repository is READY."""
        return self.started and all(e.state == "READY" for v in self.repository.models.values() for e in v.values())

    async def load(self, name: str) -> None:
        """(Re)load every version of ``name`` (the repository extension's load)."""
        for entry in self._versions(name).values():
            await self._unload(entry)
            await self._load(entry)
            if entry.state != "READY":
                raise InvalidInput(f"failed to load model {name!r} version {entry.version}: {entry.reason}")

    async def unload(self, name: str) -> None:
        for entry in self._versions(name).values():
            await self._unload(entry)

    async def _load(self, entry: ModelEntry) -> None:
        async with entry.lock:
            if entry.state == "READY":
                return
            entry.state, entry.reason = "LOADING", "loading"
            started = time.perf_counter()
            loop = asyncio.get_running_loop()
            try:
                node = entry.build()
                await loop.run_in_executor(self._pool, node.load)
                entry.release = await loop.run_in_executor(self._pool, entry.fingerprint)
                await node.start(self._pool)
                self._bind_metrics(node)
                await self._warm_up(node)
            except Exception as exc:
                entry.state, entry.reason, entry.node = "UNAVAILABLE", f"load failed: {type(exc).__name__}: {exc}", None
                logger.exception("Model %s version %s failed to load", entry.name, entry.version)
                return
            entry.node, entry.state, entry.reason = node, "READY", ""
            logger.info(
                "Model %s version %s ready in %.2fs (fingerprint %s; from %s)",
                entry.name,
                entry.version,
                time.perf_counter() - started,
                entry.release,
                entry.source,
            )

    async def _unload(self, entry: ModelEntry, grace_s: float = 5.0) -> None:
        async with entry.lock:
            node, entry.node = entry.node, None
            if node is None:
                entry.state, entry.reason = "UNAVAILABLE", "unloaded"
                return
            entry.state, entry.reason = "UNLOADING", "unloading"
            await node.stop(grace_s)
            entry.state, entry.reason = "UNAVAILABLE", "unloaded"

    async def _warm_up(self, node: ModelNode) -> None:
        """A few batches of zeros shaped like the signature (dynamic dimensions = 1), then settle where it runs."""
        if not node.runtime.signature.inputs:  # a handler: its inputs are whatever its callers send
            return
        inputs = {}
        for spec in node.runtime.signature.inputs:
            dtype = numpy_dtype(spec.dtype)
            shape = tuple(1 if d < 0 else d for d in (spec.shape or (1,)))
            inputs[spec.name] = np.zeros(shape, dtype=dtype) if dtype.kind != "O" else np.full(shape, b"", dtype=object)
        for _ in range(self.warmup_runs):
            await node.infer(node.check_inputs(inputs))
        node.settle_execution()
        await asyncio.get_running_loop().run_in_executor(self._pool, node.learn_batch_costs)
        fast = node.fastest_run_s is not None and node.fastest_run_s <= 0.05  # never block the loop for long
        if self._single_core and node.on_cpu and fast and node.execution == "auto":
            # One core: a worker thread cannot run beside the event loop, so handing each batch to it only adds
            # the hop and the wake-ups (measured: 4-6% fewer images/s over gRPC). The engine releases the GIL,
            # so gRPC's own I/O thread keeps receiving while a batch runs on the loop.
            node.runs_on_loop = True
            logger.info("Model %s runs on the event loop (one core)", node.name)

    def _bind_metrics(self, node: ModelNode) -> None:
        if self.metrics is None:
            return
        node.on_batch = self.metrics.batch_observer("v2", node.name)

    # -- lookups -----------------------------------------------------------------------------------------------------

    def _versions(self, name: str) -> dict[str, ModelEntry]:
        versions = self.repository.models.get(name)
        if versions is None:
            raise NotFound(f"unknown model {name!r} (this server has: {', '.join(sorted(self.repository.models))})")
        return versions

    def entry(self, name: str, version: str = "") -> ModelEntry:
        """The entry for ``name`` at ``version`` ("" = the highest version).

        Raises:
            NotFound: no such model or version.
        """
        if not version:
            latest = self.repository.latest.get(name)
            if latest is not None:
                return latest
        versions = self._versions(name)
        entry = versions.get(version)
        if entry is None:
            raise NotFound(
                f"model {name!r} has no version {version!r} (it has: {', '.join(sorted(versions, key=_version_key))})"
            )
        return entry

    def ready_node(self, name: str, version: str = "") -> tuple[ModelEntry, ModelNode]:
        entry = self.entry(name, version)
        node = entry.node
        if entry.state != "READY" or node is None:
            raise NotReady(f"model {name!r} version {entry.version} is not ready: {entry.reason}")
        return entry, node

    # -- protocol answers --------------------------------------------------------------------------------------------

    def server_metadata(self) -> dict[str, Any]:
        return {
            "name": self.server_name,
            "version": self.server_version,
            "extensions": ["binary_tensor_data", "model_repository", "parameters"],
        }

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """v2 model metadata; ``parameters`` carries the release fingerprint and the model's batching."""
        entry, node = self.ready_node(name, version)
        signature = node.runtime.signature
        return {
            "name": entry.name,
            "versions": sorted(self._versions(name), key=_version_key),
            "platform": f"{node.runtime.name}",
            "inputs": [_tensor_meta(s.name, s.dtype, s.shape) for s in signature.inputs],
            "outputs": [_tensor_meta(s.name, s.dtype, s.shape) for s in signature.outputs],
            "parameters": {
                RELEASE_PARAMETER: entry.release or "",
                "max_batch_size": node.policy.max_batch_size,
            },
        }

    def index(self, *, ready_only: bool = False) -> list[dict[str, str]]:
        rows = []
        for name in sorted(self.repository.models):
            for version, entry in sorted(self.repository.models[name].items(), key=lambda kv: _version_key(kv[0])):
                if ready_only and entry.state != "READY":
                    continue
                row = {"name": name, "version": version, "state": entry.state}
                if entry.reason and entry.state != "READY":
                    row["reason"] = entry.reason
                rows.append(row)
        return rows

    async def infer(
        self,
        name: str,
        version: str,
        inputs: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
    ) -> tuple[ModelEntry, TensorDict]:
        """Run one request's named tensors (with their batch dimension) through the model's batcher.

        Raises:
            NotFound, NotReady, InvalidInput (names, datatypes or shapes that do not match), Overloaded,
            DeadlineExceeded.
        """
        entry, node = self.ready_node(name, version)
        tensors = _check_against_signature(node, inputs)
        return entry, await self._admission.run(lambda: node.infer(tensors), timeout_s, what="inference")


class HandlerRuntime(Runtime):
    """A handler node behind the model interface, so an inference server can serve it over v2: the request's
    tensors become the handler's input value and its output value becomes tensors (``pipeserve.v2.values``)."""

    name: ClassVar[str] = "handler"
    releases_gil: ClassVar[bool] = False
    is_thread_safe: ClassVar[bool] = False

    def __init__(self, node: HandlerNode) -> None:
        super().__init__(RuntimeOptions(artifact=None))
        self.node = node

    def load(self) -> None:
        self.node.load()
        self._signature = Signature(inputs=(), outputs=())

    def predict(self, inputs: TensorDict) -> TensorDict:
        value = decode_value(inputs)
        if self.node.is_async:
            return encode_value(asyncio.run(self.node.acall(value)))  # in the model's own worker thread
        return encode_value(self.node.call(value))

    def describe(self) -> dict[str, Any]:
        return {"runtime": "handler", "handler_module": self.node.target}


def _handler_entry(loaded: LoadedSpec, node: NodeSpec, release: Callable[[], str]) -> ModelEntry:
    meta = node.model_load_meta
    assert meta is not None
    assert meta.handler_module is not None
    factory = resolve_handler(meta.handler_module, loaded.base_dir, file=str(loaded.path), node=node.name)
    context = HandlerContext(node=node.name, base_dir=loaded.base_dir, params=dict(node.params), labels=loaded.labels)

    def build() -> ModelNode:
        runtime = HandlerRuntime(HandlerNode(node.name, meta.handler_module or "", factory, context))
        policy = BatchPolicy(max_batch_size=1, max_queue_size=1024, workers=1)
        return ModelNode(
            node.name, runtime, policy, version=meta.version, pipeline="v2", execution="thread", queued=True
        )

    return ModelEntry(node.name, meta.version, build, release, source=f"{loaded.path} node {node.name!r} (handler)")


def _check_against_signature(node: ModelNode, inputs: Mapping[str, Any]) -> TensorDict:
    """The request's tensors, checked like Triton checks them: names, datatypes (no silent casts) and shapes."""
    signature = node.runtime.signature
    if not signature.inputs:  # a handler served as a model: any named tensors (pipeserve.v2.values)
        return {name: np.asarray(value) for name, value in inputs.items()}
    names = [s.name for s in signature.inputs]
    unknown = [n for n in inputs if n not in names]
    missing = [n for n in names if n not in inputs]
    if unknown or missing:
        raise InvalidInput(
            f"model {node.name!r} got inputs {sorted(inputs)}" + (f" (unknown: {unknown})" if unknown else ""),
            expected=f"inputs {names}",
        )
    tensors: TensorDict = {}
    for spec in signature.inputs:
        array = np.asarray(inputs[spec.name])
        want = _v2_name(spec.dtype)
        got = _V2_NAMES.get(array.dtype) or _v2_name(str(array.dtype))
        if want is not None and got != want:
            raise InvalidInput(
                f"input {spec.name!r} of model {node.name!r} has datatype {got}", expected=f"datatype {want}"
            )
        tensors[spec.name] = array
    return node.check_inputs(tensors)


@functools.cache
def _v2_name(dtype: str) -> str | None:
    try:
        return datatype_of(numpy_dtype(dtype))
    except ValueError:
        return None


#: The v2 name of each fixed-size NumPy dtype (``str(dtype)`` is slow enough to show in a request's profile).
_FIXED_SIZE = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16")
_V2_NAMES: dict[np.dtype[Any], str | None] = {
    np.dtype(name): _v2_name(name) for name in (*_FIXED_SIZE, "float32", "float64")
}


def _tensor_meta(name: str, dtype: str, shape: tuple[int, ...] | None) -> dict[str, Any]:
    return {"name": name, "datatype": _v2_name(dtype) or dtype, "shape": list(shape) if shape is not None else [-1]}


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


def _builder(
    name: str,
    meta: ModelLoadMeta,
    batching: BatchingSpec | None,
    base_dir: Path,
    artifact: Path | None,
    file: str,
) -> Callable[[], ModelNode]:
    def build() -> ModelNode:
        return build_model_node(
            name, meta, batching, base_dir=base_dir, artifact=artifact, file=file, pipeline="v2", queued=True
        )

    return build


def _read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.yaml"
    if not path.is_file():
        return {}
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(config, dict):
        raise SpecError("config.yaml must be a mapping (model_load_meta fields and batching)", file=path)
    return config


def _find_artifact(version_dir: Path, runtime: str | None) -> tuple[Path, str]:
    candidates = sorted(p for p in version_dir.iterdir() if p.name.startswith("model"))
    for path in candidates:
        found = runtime or _RUNTIME_BY_SUFFIX.get(path.suffix)
        if found is not None:
            return path, found
    raise SpecError(
        f"no model file in {version_dir}",
        field="expected model.onnx, model.pt or model.joblib (or a config.yaml naming the runtime)",
    )


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
