"""Runs one request through a compiled pipeline: sync nodes grouped per thread hop, models via batchers."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeserve.batching import BatchPolicy, CpuLane
from pipeserve.errors import InvalidInput, NodeFailed, NotFound, NotReady, PipeserveError, SpecError
from pipeserve.observability import tracing
from pipeserve.pipeline.context import request_annotations, request_params
from pipeserve.pipeline.graph import DEFAULT_ENDPOINT, INPUT
from pipeserve.pipeline.handlers import HandlerContext, resolve_handler
from pipeserve.pipeline.loader import LoadedSpec
from pipeserve.pipeline.nodes import HandlerNode, ModelNode, StepNode
from pipeserve.pipeline.remote import RemoteInference, RemoteModelNode
from pipeserve.pipeline.spec import BatchingSpec, ModelLoadMeta, NodeSpec
from pipeserve.pipeline.steps import StepContext, create_step
from pipeserve.runtimes import RuntimeOptions
from pipeserve.runtimes.devices import assign_devices
from pipeserve.runtimes.registry import runtime_class
from pipeserve.types import Signature, TensorSpec, numpy_dtype

logger = logging.getLogger(__name__)

Node = StepNode | HandlerNode | ModelNode | RemoteModelNode
#: Called after each node with (node name, seconds, failed).
NodeObserver = Callable[[str, float, bool], None]


@dataclass(frozen=True, slots=True)
class _SyncSegment:
    """Consecutive sync nodes, run in one call: inline when all are light, else in one worker-thread hop.

    ``on_lane``: a thread cannot run beside the loop on a single core, so handing the work over only costs the
    hop; the segment runs on the loop instead, when its turn comes on the pipeline's ``CpuLane`` (FIFO, one
    job at a time, the loop's I/O polled between jobs). Only segments that typically take under
    ``CpuLane.MAX_JOB_S`` do; longer ones keep the thread, so that the loop keeps answering meanwhile.

    ``then_model``: the last node is a batched model on the same lane, fed by this segment alone. When its batcher
    would run the request alone and next anyway (adaptive batching found batches of one cheapest), it runs in the
    same turn as the nodes before it, as it would without batching: no second turn, no queue. Otherwise the request
    leaves the lane and queues for a batch like any other.
    """

    nodes: tuple[Node, ...]
    inline: bool
    on_lane: bool = False
    then_model: bool = False


@dataclass(frozen=True, slots=True)
class _AsyncSegment:
    node: Node


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one endpoint runs: its segments in order, and where each segment's input comes from."""

    endpoint: str
    target: str
    segments: tuple[_SyncSegment | _AsyncSegment, ...]
    sources: tuple[tuple[str, ...], ...]
    keys: tuple[tuple[str, ...] | None, ...]
    is_chain: bool


class Pipeline:
    """A spec compiled into runnable nodes, with one plan per endpoint.

    Example:
        >>> pipeline = Pipeline.compile(load_spec("examples/iris"))  # doctest: +SKIP
        >>> await pipeline.start()                                     # doctest: +SKIP
        >>> await pipeline.run(np.array([[5.1, 3.5, 1.4, 0.2]], dtype=np.float32))  # doctest: +SKIP
    """

    def __init__(self, loaded: LoadedSpec, nodes: list[Node], *, worker_threads: int | None = None) -> None:
        self.loaded = loaded
        self.name = loaded.spec.name
        self.graph = loaded.graph
        self.nodes = {node.name: node for node in nodes}
        self._order = list(self.nodes.values())
        self._worker_threads = worker_threads or default_worker_threads()
        self._executor: ThreadPoolExecutor | None = None
        self._plans: dict[str, _Plan] = {}
        self.observer: NodeObserver | None = None
        self._single_core = available_cores() == 1
        #: On a single core, CPU-bound work runs on the event loop, one job at a time, through this lane.
        self._lane = CpuLane()
        self._segment_times: dict[tuple[str, ...], list[float]] = {}
        #: Nodes whose failure the request survives (their consumers get None).
        self._optional = {spec.name for spec in loaded.spec.nodes if spec.optional}
        self._warming = True

    @classmethod
    def compile(
        cls,
        loaded: LoadedSpec,
        *,
        worker_threads: int | None = None,
        remote: RemoteInference | None = None,
        node_remotes: Mapping[str, RemoteInference] | None = None,
    ) -> Pipeline:
        """Resolve every node's handler, step or runtime (imports only; nothing is loaded).

        With ``remote``, model nodes are not loaded here: they call the models on v2 inference servers. With
        ``node_remotes``, just the named model nodes do (a gateway's remote nodes), each through its own.

        Raises:
            SpecError: a handler is unimportable, a step or runtime unknown, or a parameter invalid.
        """
        file = str(loaded.path)
        unreachable = set(loaded.graph.unreachable)
        # Every node is compiled, so that a typo in an unreachable node is still an error; only reachable ones run.
        given = node_remotes or {}
        compiled = [_compile_node(loaded, spec, file, remote, given.get(spec.name)) for spec in loaded.spec.nodes]
        nodes = [node for node in compiled if node.name not in unreachable]
        return cls(loaded, nodes, worker_threads=worker_threads)

    @property
    def models(self) -> list[ModelNode]:
        return [node for node in self._order if isinstance(node, ModelNode)]

    @property
    def remotes(self) -> list[RemoteModelNode]:
        return [node for node in self._order if isinstance(node, RemoteModelNode)]

    @property
    def endpoints(self) -> dict[str, str]:
        """Endpoint name -> the node whose output it answers (``predict`` is always there)."""
        return dict(self.graph.endpoints)

    async def start(self) -> None:
        """Load every node (models and handlers, in worker threads) and start the batchers."""
        self._executor = ThreadPoolExecutor(
            max_workers=self._worker_threads, thread_name_prefix=f"pipeline-{self.name}"
        )
        loop = asyncio.get_running_loop()
        for node in self._order:
            started = time.perf_counter()
            try:
                await loop.run_in_executor(self._executor, node.load)
            except SpecError as exc:
                raise SpecError(exc.problem, file=self.loaded.path, node=node.name, field=exc.field) from exc
            except Exception as exc:
                raise SpecError(
                    f"load failed: {type(exc).__name__}: {exc}", file=self.loaded.path, node=node.name
                ) from exc
            logger.info("Loaded node %s (%s) in %.2fs", node.name, node.kind, time.perf_counter() - started)
        for model in self.models:
            await model.start(self._executor)
        await self.connect_remotes()

    async def connect_remotes(self) -> None:
        """Learn each remote node's signature from its endpoints (waiting for one to come up), check the
        connections and plan the endpoints. Safe to call again after it raised.

        Raises:
            NotReady: no endpoint serving our release answered in time.
        """
        for node in self.remotes:
            if node.signature is None:
                await node.start()
        self._check_connections()
        self._plans = self._build_plans()

    def _check_connections(self) -> None:
        """Model feeding model: once both signatures are known (after loading), their tensors must fit.

        Raises:
            SpecError: naming the consumer, the producer and both tensors.
        """
        for name, node in self.nodes.items():
            deps = self.graph.deps.get(name, ())
            if not isinstance(node, ModelNode | RemoteModelNode) or len(deps) != 1 or deps[0] == INPUT:
                continue
            producer = self.nodes.get(deps[0])
            out = _passed_output(producer)
            inp = _sole_input(node)
            if producer is None or out is None or inp is None:
                continue
            problem = _mismatch(out, inp)
            if problem:
                raise SpecError(
                    f"takes {producer.name!r}'s output {out.describe()}, but its input is {inp.describe()}: {problem}",
                    file=self.loaded.path,
                    node=name,
                    field="inputs",
                )

    async def finish_warm_up(self) -> None:
        """After warm-up runs: let each model decide where it runs and learn its batch costs (in a worker thread),
        and regroup the nodes accordingly."""
        loop = asyncio.get_running_loop()
        for model in self.models:
            model.settle_execution()
            await loop.run_in_executor(self._executor, model.learn_batch_costs)
            # On a single core a batch gains nothing from a thread hop either: it takes its turn on the lane,
            # with as many rows as run within the lane's job budget.
            one = model.fastest_run_s
            if (
                self._single_core
                and model.queued
                and model.on_cpu
                and model.execution == "auto"
                and not model.runs_on_loop
                and one is not None
                and one <= CpuLane.MAX_JOB_S
            ):
                model.run_on_lane(self._lane)
        self._warming = False
        self._plans = self._build_plans()

    def _build_plans(self) -> dict[str, _Plan]:
        return {endpoint: self._build_plan(endpoint, order) for endpoint, order in self.graph.plans.items()}

    def _build_plan(self, endpoint: str, order: tuple[str, ...]) -> _Plan:
        graph = self.graph
        consumers = graph.consumers(order)
        segments: list[_SyncSegment | _AsyncSegment] = []
        run: list[Node] = []

        def flush() -> None:
            if run:
                segment = _SyncSegment(tuple(run), inline=all(n.runs_inline for n in run))
                if self._single_core and not segment.inline and not self._warming:
                    segment = self._lane_segment(segment)
                segments.append(segment)
                run.clear()

        for name in order:
            node = self.nodes[name]
            if node.is_async:
                flush()
                segments.append(_AsyncSegment(node))
                continue
            if name in self._optional:  # alone in its segment: its failure must not take its neighbours along
                flush()
                run.append(node)
                flush()
                continue
            joins = (
                bool(run)
                and graph.deps[name] == (run[-1].name,)
                and consumers[run[-1].name] == 1
                and run[-1].name not in self._optional
            )
            if not joins:
                flush()
            run.append(node)
        flush()
        if self._single_core and not self._warming:
            segments = self._fuse_lane_models(segments, consumers)
        firsts = [s.nodes[0].name if isinstance(s, _SyncSegment) else s.node.name for s in segments]
        sources = tuple(graph.deps[name] for name in firsts)
        keys = tuple(graph.keys[name] for name in firsts)
        lasts = [s.nodes[-1].name if isinstance(s, _SyncSegment) else s.node.name for s in segments]
        expected = [(INPUT,), *[(last,) for last in lasts[:-1]]]
        is_chain = list(sources) == expected and all(k is None for k in keys) and not self._optional & set(order)
        return _Plan(endpoint, order[-1], tuple(segments), sources, keys, is_chain)

    def _fuse_lane_models(
        self, segments: list[_SyncSegment | _AsyncSegment], consumers: Mapping[str, int]
    ) -> list[_SyncSegment | _AsyncSegment]:
        """A lane segment followed by the batched model it alone feeds (on the same lane) becomes one segment whose
        model may run in the same turn (``_SyncSegment.then_model``)."""
        fused: list[_SyncSegment | _AsyncSegment] = []
        for segment in segments:
            previous = fused[-1] if fused else None
            model = segment.node if isinstance(segment, _AsyncSegment) else None
            if (
                isinstance(previous, _SyncSegment)
                and previous.on_lane
                and not previous.then_model
                and isinstance(model, ModelNode)
                and model.lane is self._lane
                and self.graph.deps[model.name] == (previous.nodes[-1].name,)
                and self.graph.keys[model.name] is None
                and consumers[previous.nodes[-1].name] == 1
                and not self._optional & {model.name, previous.nodes[-1].name}
            ):
                fused[-1] = _SyncSegment((*previous.nodes, model), inline=False, on_lane=True, then_model=True)
                continue
            fused.append(segment)
        return fused

    def _lane_segment(self, segment: _SyncSegment) -> _SyncSegment:
        times = self._segment_times.get(tuple(node.name for node in segment.nodes), [])
        if not times or statistics.median(times) > CpuLane.MAX_JOB_S:
            return segment
        return _SyncSegment(segment.nodes, inline=False, on_lane=True)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop the batchers (finishing queued work within ``grace_s``) and release the models."""
        for model in self.models:
            await model.stop(grace_s)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def run(
        self, value: Any, *, endpoint: str = DEFAULT_ENDPOINT, params: Mapping[str, Any] | None = None
    ) -> Any:
        """Run one request's decoded input through the nodes ``endpoint`` needs; return its node's output.

        ``params`` (e.g. a query's ``k``) reach the steps through ``request_params``.

        Raises:
            NotFound: no such endpoint.
            InvalidInput: a node found the input unusable (its message says why).
            NodeFailed: a node raised; ``.node`` names it and the cause is chained.
            PipeserveError: overload, deadlines, not ready.
        """
        plan = self._plans.get(endpoint)
        if plan is None:
            raise NotFound(f"pipeline {self.name!r} has no endpoint {endpoint!r} (it has: {', '.join(self._plans)})")
        token = request_params.set(params) if params else None
        try:
            if plan.is_chain:
                for segment in plan.segments:
                    value = await self._run_segment(segment, value)
                return value
            return await self._run_dag(plan, value)
        finally:
            if token is not None:
                request_params.reset(token)

    async def _run_dag(self, plan: _Plan, value: Any) -> Any:
        """Every segment starts as soon as the segments it takes from are done: independent branches of the DAG
        run at the same time (async nodes interleave on the loop, sync ones in worker threads). The first failure
        fails the request and cancels what is still running.
        """
        tasks: dict[str, asyncio.Task[Any]] = {}

        async def run(
            segment: _SyncSegment | _AsyncSegment, sources: tuple[str, ...], keys: tuple[str, ...] | None
        ) -> Any:
            inputs = [value if source == INPUT else await tasks[source] for source in sources]
            given = inputs[0] if keys is None else dict(zip(keys, inputs, strict=True))
            last = segment.nodes[-1] if isinstance(segment, _SyncSegment) else segment.node
            if last.name not in self._optional:
                return await self._run_segment(segment, given)
            try:
                return await self._run_segment(segment, given)
            except (NodeFailed, InvalidInput, NotReady) as exc:  # deadlines and overload still fail the request
                _skipped(last.name, exc)
                return None

        try:
            for segment, sources, keys in zip(plan.segments, plan.sources, plan.keys, strict=True):
                last = segment.nodes[-1] if isinstance(segment, _SyncSegment) else segment.node
                tasks[last.name] = asyncio.create_task(run(segment, sources, keys))
            return await tasks[plan.target]
        finally:
            for task in tasks.values():
                if not task.done():
                    task.cancel()
                elif not task.cancelled():
                    task.exception()  # retrieved, so a failed sibling logs no "exception was never retrieved"

    async def _run_segment(self, segment: _SyncSegment | _AsyncSegment, value: Any) -> Any:
        if isinstance(segment, _AsyncSegment):
            return await self._run_async(segment.node, value)
        if segment.inline:
            return self._run_sync(segment.nodes, value)
        if segment.then_model:
            *nodes, model = segment.nodes
            async with self._lane:
                value = self._run_sync(tuple(nodes), value)
                if model.runs_alone(holds_lane=True):  # type: ignore[union-attr]  # a ModelNode (see _fuse_lane_models)
                    return await self._run_async(model, value, holds_lane=True)
            return await self._run_async(model, value)
        if segment.on_lane:
            async with self._lane:
                return self._run_sync(segment.nodes, value)
        run = self._run_sync_timed if self._warming else self._run_sync
        if request_params.get() or tracing.enabled():  # worker threads do not inherit context variables
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, contextvars.copy_context().run, run, segment.nodes, value
            )
        return await asyncio.get_running_loop().run_in_executor(self._executor, run, segment.nodes, value)

    def _run_sync_timed(self, nodes: tuple[Node, ...], value: Any) -> Any:
        """``_run_sync``, recording how long the segment took (during warm-up, to decide where it runs)."""
        started = time.perf_counter()
        result = self._run_sync(nodes, value)
        self._segment_times.setdefault(tuple(node.name for node in nodes), []).append(time.perf_counter() - started)
        return result

    def _run_sync(self, nodes: tuple[Node, ...], value: Any) -> Any:
        for node in nodes:
            with _NodeRun(self, node):
                value = node.call(value)
        return value

    async def _run_async(self, node: Node, value: Any, *, holds_lane: bool = False) -> Any:
        with _NodeRun(self, node):
            if holds_lane:
                return await node.acall(value, holds_lane=True)  # type: ignore[union-attr,call-arg]  # a ModelNode
            return await node.acall(value)  # type: ignore[union-attr]  # only async nodes get here

    def _observe(self, node: str, started: float, *, failed: bool) -> None:
        if self.observer is not None:
            self.observer(node, time.perf_counter() - started, failed)

    def describe(self) -> list[dict[str, Any]]:
        return [node.describe() for node in self._order]

    def execution_plan(self) -> dict[str, list[dict[str, Any]]]:
        """Per endpoint: how the nodes are grouped and where each group runs, for metadata and logs."""
        plans: dict[str, list[dict[str, Any]]] = {}
        for endpoint, plan in self._plans.items():
            groups = []
            for segment in plan.segments:
                if isinstance(segment, _SyncSegment):
                    where = "event loop" if segment.inline else "worker thread"
                    if segment.on_lane:
                        where = "event loop, one job at a time (single core)"
                    if segment.then_model:
                        where += f"; {segment.nodes[-1].name} in the same turn when it runs batches of one"
                    groups.append({"nodes": [n.name for n in segment.nodes], "runs_in": where})
                else:
                    groups.append({"nodes": [segment.node.name], "runs_in": "awaited (batcher or async handler)"})
            plans[endpoint] = groups
        return plans


class _NodeRun:
    """Around one node's run: its latency and failure for the observer (metrics), its span when tracing is on,
    and anything unexpected it raises wrapped as ``NodeFailed`` naming it (the cause chained)."""

    __slots__ = ("_node", "_pipeline", "_span", "_started")

    def __init__(self, pipeline: Pipeline, node: Node) -> None:
        self._pipeline = pipeline
        self._node = node
        self._span: Any = None
        self._started = 0.0

    def __enter__(self) -> None:
        if tracing.enabled():
            node = self._node
            attributes = {"pipeserve.node": node.name, "pipeserve.node_kind": node.kind}
            self._span = tracing.span(f"node {node.name}", attributes=attributes)
            self._span.__enter__()
        self._started = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self._pipeline._observe(self._node.name, self._started, failed=isinstance(exc, Exception))
        raised = exc
        if isinstance(exc, Exception) and not isinstance(exc, InvalidInput | PipeserveError):
            raised = NodeFailed(self._node.name, exc)
        if self._span is not None:
            self._span.__exit__(type(raised) if raised else None, raised, tb)
        if raised is not exc and raised is not None:
            raise raised from exc


def _skipped(node: str, exc: Exception) -> None:
    """Record that an optional node failed and was left out (the response lists it; the log has the cause)."""
    cause = exc.cause if isinstance(exc, NodeFailed) and exc.cause is not None else exc
    logger.warning("Optional node %s failed and was skipped: %s: %s", node, type(cause).__name__, cause)
    annotations = request_annotations.get()
    if annotations is not None:
        annotations.setdefault("skipped", []).append({"node": node, "error": str(exc)})


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under taskset or a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_worker_threads(workers: int = 1) -> int:
    """Threads for CPU-bound node work: the cores this process may run on, shared by its sibling workers.

    Image decoding and the engines release the GIL, so one thread per core keeps every core busy; more threads
    than cores only interleave requests, which makes each slower and evicts the model from the cache.
    """
    return max(1, available_cores() // max(1, workers))


def _compile_node(
    loaded: LoadedSpec,
    spec: NodeSpec,
    file: str,
    models_remote: RemoteInference | None = None,
    node_remote: RemoteInference | None = None,
) -> Node:
    """A node as it runs here. ``models_remote`` (the split) serves every model node; ``node_remote`` (a
    gateway's) serves this node, model or handler."""
    meta = spec.model_load_meta
    if node_remote is not None and meta is not None and meta.runtime is None:
        return RemoteModelNode(
            spec.name,
            node_remote,
            model=meta.remote.model or spec.name,
            version=meta.remote.version if meta.remote.version is not None else meta.version,
            values=True,
        )
    remote = node_remote or models_remote
    labels = loaded.labels
    if spec.step is not None:
        context = StepContext(node=spec.name, base_dir=loaded.base_dir, labels=labels)
        return StepNode(spec.name, spec.step, create_step(spec.step, spec.params, context, file=file))
    meta = spec.model_load_meta
    assert meta is not None
    if meta.runtime is None:
        assert meta.handler_module is not None
        factory = resolve_handler(meta.handler_module, loaded.base_dir, file=file, node=spec.name)
        context_h = HandlerContext(node=spec.name, base_dir=loaded.base_dir, params=dict(spec.params), labels=labels)
        return HandlerNode(spec.name, meta.handler_module, factory, context_h)
    if remote is not None:
        return RemoteModelNode(
            spec.name,
            remote,
            model=meta.remote.model or spec.name,
            version=meta.remote.version if meta.remote.version is not None else meta.version,
            outputs=meta.remote.outputs or meta.outputs,
            input_names=meta.remote.inputs,
        )
    return build_model_node(
        spec.name,
        meta,
        spec.batching,
        base_dir=loaded.base_dir,
        artifact=loaded.resolve(meta.artifact) if meta.artifact else None,
        file=file,
        pipeline=loaded.spec.name,
    )


def build_model_node(
    name: str,
    meta: ModelLoadMeta,
    batching: BatchingSpec | None,
    *,
    base_dir: Path,
    artifact: Path | None,
    file: str = "",
    pipeline: str = "",
    queued: bool | None = None,
) -> ModelNode:
    """A model node from its ``model_load_meta`` and ``batching``: one runtime per replica, devices assigned.

    ``queued`` puts requests through a batcher even without ``batching`` (FIFO, bounded, deadlines, batches of
    one): an inference server does this for every model. Default: queued exactly when batching is configured.

    Raises:
        SpecError: an unknown runtime.
    """
    assert meta.runtime is not None
    try:
        runtime_cls = runtime_class(meta.runtime)
    except SpecError as exc:
        raise SpecError(exc.problem, file=file, node=name, field="model_load_meta.runtime") from exc
    extra = dict(meta.options)
    if meta.runtime == "python" and meta.handler_module is not None:
        extra.setdefault("class", meta.handler_module)
    devices = assign_devices(meta.devices or [meta.device], meta.replicas)
    replicas = [
        runtime_cls(
            RuntimeOptions(
                artifact=artifact,
                device=device,
                intra_op_threads=meta.intra_op_threads,
                inter_op_threads=meta.inter_op_threads,
                extra=extra,
                base_dir=base_dir,
            )
        )
        for device in devices
    ]
    policy = (
        BatchPolicy(
            max_batch_size=batching.max_batch_size,
            max_wait_s=batching.max_latency_ms / 1000.0,
            max_queue_size=batching.max_queue_size,
            workers=meta.replicas,
            mode=batching.mode,
            batch_overhead_s=batching.batch_overhead_ms / 1000.0,
        )
        if batching is not None
        else BatchPolicy(max_batch_size=1, max_queue_size=1024, workers=meta.replicas)
    )
    return ModelNode(
        name,
        replicas,
        policy,
        version=meta.version,
        outputs=meta.outputs,
        pipeline=pipeline,
        execution=meta.execution,
        queued=batching is not None if queued is None else queued,
    )


def _signature(node: Node | None) -> Signature | None:
    if isinstance(node, ModelNode):
        return node.runtime.signature if node.runtime.is_loaded else None
    if isinstance(node, RemoteModelNode):
        return node.signature
    return None


def _passed_output(node: Node | None) -> TensorSpec | None:
    """The one tensor a model node passes on (its only output, or its one selected output), if known."""
    signature = _signature(node)
    if signature is None:
        return None
    selected = node.selected_outputs if isinstance(node, ModelNode | RemoteModelNode) else None
    names = selected or signature.output_names()
    if len(names) != 1:
        return None
    return next((spec for spec in signature.outputs if spec.name == names[0]), None)


def _sole_input(node: Node) -> TensorSpec | None:
    signature = _signature(node)
    if signature is None or len(signature.inputs) != 1:
        return None
    return signature.inputs[0]


def _mismatch(out: TensorSpec, inp: TensorSpec) -> str | None:
    """Why ``out`` cannot feed ``inp``: numbers vs text, rank, or a fixed dimension (batch excluded) that differs."""
    try:
        out_kind, in_kind = numpy_dtype(out.dtype).kind, numpy_dtype(inp.dtype).kind
    except ValueError:
        return None
    if (out_kind in "biuf") != (in_kind in "biuf"):
        return f"{out.dtype} cannot become {inp.dtype}"
    if out.shape is None or inp.shape is None:
        return None
    if len(out.shape) != len(inp.shape):
        return f"{len(out.shape)} dimensions where {len(inp.shape)} are expected"
    for axis, (got, want) in enumerate(zip(out.shape[1:], inp.shape[1:], strict=True), start=1):
        if got > 0 and want > 0 and got != want:
            return f"dimension {axis} is {got} where {want} is expected"
    return None
