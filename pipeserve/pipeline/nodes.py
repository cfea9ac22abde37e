"""Compiled pipeline nodes: a built-in step, a user handler, or a model behind its batcher."""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from pipeserve.batching import Batcher, BatchPolicy, CpuLane
from pipeserve.batching.batcher import BatchInfo
from pipeserve.errors import InvalidInput, NotReady, SpecError
from pipeserve.pipeline.context import request_annotations, request_deadline, requests_in_progress
from pipeserve.pipeline.handlers import HandlerContext, HandlerFactory
from pipeserve.pipeline.steps import Step
from pipeserve.runtimes import Runtime
from pipeserve.types import TensorDict, numpy_dtype

logger = logging.getLogger(__name__)

NodeKind = Literal["model", "handler", "step"]
Execution = Literal["auto", "thread", "inline"]

#: ``execution: auto`` runs a model on the event loop when a batch of one takes less than this. Handing a
#: call to a worker thread and back costs 20-40 us; a model faster than ~150 us gains nothing from the
#: thread and blocks the loop for less time than a JSON parse of a large body.
INLINE_BELOW_S = 150e-6


class StepNode:
    """A built-in step; sync. Heavy steps run in the pipeline's worker threads, light ones inline."""

    kind: NodeKind = "step"
    is_async = False

    def __init__(self, name: str, step_name: str, step: Step) -> None:
        self.name = name
        self.step_name = step_name
        self.step = step
        self.runs_inline = not step.is_cpu_heavy

    def load(self) -> None:
        return None

    def call(self, value: Any) -> Any:
        return self.step(value)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "step", "step": self.step_name, "params": self.step.params.model_dump()}


class HandlerNode:
    """A user handler. ``async def predict`` runs on the event loop; a sync one in a worker thread."""

    kind: NodeKind = "handler"

    def __init__(self, name: str, target: str, factory: HandlerFactory, context: HandlerContext) -> None:
        self.name = name
        self.target = target
        self._factory = factory
        self._context = context
        self._handler: Any = None
        self.is_async = False
        self.runs_inline = False

    def load(self) -> None:
        handler = self._factory()
        if callable(getattr(handler, "load", None)):
            handler.load(self._context)
        self._handler = handler
        self.is_async = inspect.iscoroutinefunction(handler.predict)

    def call(self, value: Any) -> Any:
        return self._handler.predict(value)

    async def acall(self, value: Any) -> Any:
        return await self._handler.predict(value)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "handler", "handler_module": self.target}


class ModelNode:
    """A model: one runtime per replica, behind a batcher when batching is configured.

    The node's input is one request's tensor (or dict of named tensors) with a leading batch dimension.
    With batching, the batcher concatenates requests along it, runs a replica's engine in a worker thread (or
    on the loop for tiny models), and splits the outputs; each replica runs one batch at a time. Without
    batching the node is a plain sync step: it runs in the same worker-thread hop as the preprocessing
    around it, so a request costs one hop, not three; replicas then take requests in turn.
    """

    kind: NodeKind = "model"

    def __init__(
        self,
        name: str,
        runtimes: Runtime | list[Runtime],
        policy: BatchPolicy,
        *,
        version: str = "1",
        outputs: list[str] | None = None,
        pipeline: str = "",
        execution: Execution = "auto",
        queued: bool | None = None,
    ) -> None:
        self.name = name
        #: Requests go through a batcher's queue (FIFO, bounded, deadlines) even at max_batch_size 1.
        self.queued = policy.is_batching if queued is None else queued
        self.replicas = runtimes if isinstance(runtimes, list) else [runtimes]
        if not self.replicas:
            raise ValueError(f"model {name!r} needs at least one replica")
        self.runtime = self.replicas[0]
        self.policy = policy
        self.version = version
        self._selected = outputs
        self._pipeline = pipeline
        self._batcher: Batcher[TensorDict, TensorDict] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._owns_executor = False
        self._input_names: list[str] = []
        self._casts: dict[str, np.dtype[Any]] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self.on_batch: Callable[[ModelNode, BatchInfo], None] | None = None
        self.execution: Execution = execution
        self.runs_on_loop = execution == "inline"
        self._recent_run_s: deque[float] = deque(maxlen=32)
        #: A single-threaded CPU engine computes on the calling thread: its cost is that thread's CPU time, which
        #: time-sharing the core with the event loop (a worker thread on one core) does not inflate, as wall
        #: time would. Others (engine threads, devices, I/O) are timed by the clock.
        self._cpu_timed = self.on_cpu and all(
            r.computes_on_calling_thread and r.options.intra_op_threads == 1 for r in self.replicas
        )
        self._recent_cost_s: deque[float] = deque(maxlen=32)
        self._locks = [threading.Lock() for _ in self.replicas]
        self._turn = itertools.count()
        self._last_inputs: TensorDict | None = None  # one real input, kept for timing the model after warm-up
        #: Set on a single core: batches run on the event loop, taking turns on this lane with the other CPU work.
        self.lane: CpuLane | None = None

    @property
    def on_cpu(self) -> bool:
        """Every replica runs on the CPU (so batches can share the pipeline's CPU thread pool, or the loop)."""
        return all(replica.options.device == "cpu" for replica in self.replicas)

    @property
    def selected_outputs(self) -> list[str] | None:
        """The outputs the node passes on (``outputs`` in the spec), or None for all."""
        return self._selected

    @property
    def is_async(self) -> bool:
        """Queued models are awaited (through their batcher); the others are called like sync steps."""
        return self.queued

    @property
    def runs_inline(self) -> bool:
        return self.runs_on_loop

    @property
    def fastest_run_s(self) -> float | None:
        """The shortest engine run seen (warm-up included), or ``None`` before any."""
        return min(self._recent_run_s) if self._recent_run_s else None

    @property
    def batcher(self) -> Batcher[TensorDict, TensorDict] | None:
        return self._batcher

    def load(self) -> None:
        for replica in self.replicas:
            replica.load()
        signature = self.runtime.signature
        self._input_names = [spec.name for spec in signature.inputs]
        for spec in signature.inputs:
            try:
                dtype = numpy_dtype(spec.dtype)
            except ValueError:
                continue
            if dtype.kind in "biuf":
                self._casts[spec.name] = dtype
            if spec.shape is not None:
                self._shapes[spec.name] = spec.shape
        names = signature.output_names()
        unknown = [n for n in self._selected or [] if n not in names]
        if unknown:
            raise SpecError(
                f"outputs {unknown} not in the model's outputs {names}", node=self.name, field="model_load_meta.outputs"
            )

    async def start(self, cpu_pool: ThreadPoolExecutor | None = None) -> None:
        """Start the batcher. Batches on CPU run in ``cpu_pool`` (the pipeline's, one thread per core), in
        line with the preprocessing: two CPU-bound threads per core only take turns and evict each other's
        data from the cache (measured: 20% fewer images/s on one core). GPU replicas get threads of their own,
        which wait on the device while the CPU pool preprocesses.
        """
        if not self.queued:
            return
        if self.on_cpu and cpu_pool is not None:
            self._executor, self._owns_executor = cpu_pool, False
        else:
            self._executor = ThreadPoolExecutor(max_workers=len(self.replicas), thread_name_prefix=f"model-{self.name}")
            self._owns_executor = True
        fns = [functools.partial(self._run_batch, replica=i) for i in range(len(self.replicas))]
        self._batcher = Batcher(
            fns,
            self.policy,
            name=f"model {self.name!r}",
            size_of=_rows,
            on_batch=self._batch_done,
            learns_latency=False,
        )
        await self._batcher.start()

    async def stop(self, grace_s: float = 5.0) -> None:
        if self._batcher is not None:
            await self._batcher.stop(grace_s)
        if self._executor is not None and self._owns_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)
        for replica in self.replicas:
            replica.unload()

    def settle_execution(self) -> None:
        """After warm-up: with ``execution: auto``, run on the loop when a batch of one takes under ``INLINE_BELOW_S``.

        Warm-up runs are few and partly cold, so a model that might be fast enough is timed again on the last
        warm-up input, and the fastest run decides (noise only ever adds time).
        """
        if self.execution != "auto" or not self._recent_run_s:
            return
        if min(self._recent_run_s) < 10 * INLINE_BELOW_S and self._last_inputs is not None:
            for _ in range(20):
                self._predict_timed(self._last_inputs, 0)
        typical = min(self._recent_run_s)
        self.runs_on_loop = typical < INLINE_BELOW_S
        logger.info(
            "Model %s: %.0f us per warm-up batch -> runs %s",
            self.name,
            typical * 1e6,
            "on the event loop" if self.runs_on_loop else "in a worker thread",
        )

    def _fits_lane(self, merged: TensorDict) -> bool:
        """A batch runs on the lane (holding the event loop) only when expected within the lane's budget; a
        request of many rows that is not runs in a worker thread, still holding the lane (so no other CPU job
        competes) while the loop keeps answering."""
        assert self.lane is not None
        expected = self._batcher.latency.fastest(_rows(merged)) if self._batcher is not None else None
        return expected is None or expected <= self.lane.MAX_JOB_S

    def learn_batch_costs(self) -> None:
        """After warm-up: what the batcher's cost model starts from. An engine's first runs are cold (allocations,
        caches) and would make their size look dearer than it is. In adaptive mode each size the batcher tries
        (1, 2, 4, ..., ``max_batch_size``) runs three times now on the warm-up's input: the first is cold (a new
        shape), the faster of the other two is what the batcher starts from (ONNX Runtime's EfficientNet-Lite0 on
        one core, on one machine: 5% cheaper per image at 2 than at 1, 11% dearer at 8; it varies by machine).
        Sizes stop growing once the cost per row is 20% over the best seen (TorchScript's EfficientNet on one core
        only gets dearer per image) or a run takes over a second; the batcher still tries them now and then.
        In fixed mode the warm-up's size and ``max_batch_size`` are timed the same way, the full size only when
        it is expected within twice the CPU lane's budget (the only use of the estimate in fixed mode): on a single
        core a batch runs on the event loop only when expected within that budget, and a full batch's first run
        under load, cold, once cost 1.8x a warm one, so that full batches were never run again (the estimate came
        only from that run). A size that fails here (memory, a fixed batch dimension) is logged and not timed: it
        fails its callers when it runs, as it would have without the warm-up. Blocks for the runs: call it in a
        worker thread.
        """
        batcher = self._batcher
        if batcher is None or self._last_inputs is None:
            return
        latency = batcher.latency
        sample = self._last_inputs
        if self.policy.mode == "adaptive":
            sizes = batcher.sizes
        else:
            one = _rows(sample)
            sizes = [one]
            full = self.policy.max_batch_size
            if full != one and self._recent_cost_s and min(self._recent_cost_s) * full / one <= 2 * CpuLane.MAX_JOB_S:
                sizes.append(full)
        costs: dict[int, float] = {}
        for size in sizes:
            batch = _repeat_rows(sample, size)
            try:
                self._predict_timed(batch, 0, learn=False)  # cold: a new shape
                warm = []
                for _ in range(2):
                    self._predict_timed(batch, 0, learn=False)
                    warm.append(self._recent_cost_s[-1])
            except Exception as exc:  # noqa: BLE001 - the warm-up only times sizes; a size that fails is not timed
                logger.warning("Model %s: a batch of %d rows failed at warm-up (%s); not timed", self.name, size, exc)
                break
            costs[size] = min(warm)
            best_per_row = min(seconds / rows for rows, seconds in costs.items())
            if costs[size] / size > 1.2 * best_per_row or self._recent_run_s[-1] > 1.0:
                break
        if not costs and self._recent_cost_s:
            costs[_rows(sample)] = min(self._recent_cost_s)
        latency.forget()
        for size, seconds in costs.items():
            latency.observe(size, seconds)

    def run_on_lane(self, lane: CpuLane) -> None:
        """Run batches on the event loop, each once it is this model's turn on ``lane`` (a single core's CPU work
        in arrival order); the batch is taken when the turn comes, so the wait for the CPU is the batching window.
        A turn takes at most the rows expected to run within ``lane.MAX_JOB_S`` (at least one).
        """
        if self._batcher is None:
            raise NotReady(f"model {self.name!r} is not started")
        self.lane = lane
        self._batcher.gate = lane
        self._batcher.gate_budget_s = lane.MAX_JOB_S

    def _predict_timed(self, inputs: TensorDict, replica: int, *, learn: bool = True) -> TensorDict:
        runtime = self.replicas[replica]
        started, started_cpu = time.perf_counter(), time.thread_time()
        if runtime.is_thread_safe:
            outputs = runtime.predict(inputs)
        else:
            with self._locks[replica]:
                outputs = runtime.predict(inputs)
        elapsed = time.perf_counter() - started
        cost = time.thread_time() - started_cpu if self._cpu_timed else elapsed
        self._recent_run_s.append(elapsed)
        self._recent_cost_s.append(cost)
        if self._batcher is not None and learn:  # the engine's own time, without the wait for a thread
            self._batcher.latency.observe(_rows(inputs), cost)
        if self._last_inputs is None:
            self._last_inputs = inputs
        return outputs

    def call(self, value: Any) -> Any:
        """Run one request's input unbatched (in the caller's thread), on the next replica in turn."""
        replica = next(self._turn) % len(self.replicas) if len(self.replicas) > 1 else 0
        return self._select(self._predict_timed(self.check_inputs(value), replica))

    def _batch_done(self, info: BatchInfo) -> None:
        if self.on_batch is not None:
            self.on_batch(self, info)

    async def acall(self, value: Any, *, holds_lane: bool = False) -> Any:
        return self._select(await self.infer(self.check_inputs(value), holds_lane=holds_lane))

    def runs_alone(self, *, holds_lane: bool = False) -> bool:
        """Whether a request now would run as a batch of its own at once, so ``infer`` skips the queue: the batcher
        would run it next and alone (``Batcher.runs_alone``), and it may run here: on the event loop, or on the CPU
        lane that the caller holds."""
        batcher = self._batcher
        if batcher is None or not (self.runs_on_loop or (holds_lane and self.lane is not None)):
            return False
        in_progress = requests_in_progress.get()
        return batcher.runs_alone(only_request=in_progress is not None and in_progress() <= 1)

    async def infer(self, tensors: TensorDict, *, holds_lane: bool = False) -> TensorDict:
        """One request's named tensors through the batcher; every output (an inference server selects its own).

        When the request would run alone and next anyway, it runs at once (no queue, no hand-over to the batcher's
        task): same answer, same batch accounting, ~50 us less per request. ``holds_lane``: the caller holds this
        node's CPU lane (a single core's turn), so a lane-gated model may run in it.
        """
        batcher = self._batcher
        if batcher is None:
            raise NotReady(f"model {self.name!r} is not started")
        if self.runs_alone(holds_lane=holds_lane):
            traced = await batcher.run_alone(tensors, deadline_s=request_deadline.get())
        else:
            traced = await batcher.submit_traced(tensors, deadline_s=request_deadline.get())
        annotations = request_annotations.get()
        if annotations is not None:
            annotations.setdefault("batches", {})[self.name] = {
                "batch_id": traced.batch.batch_id,
                "batch_size": traced.batch.size,
                "queue_wait_ms": round(traced.queue_wait_s * 1000, 3),
            }
        return traced.result

    def _select(self, outputs: TensorDict) -> Any:
        if self._selected is None:
            return next(iter(outputs.values())) if len(outputs) == 1 else outputs
        if len(self._selected) == 1:
            return outputs[self._selected[0]]
        return {name: outputs[name] for name in self._selected}

    def check_inputs(self, value: Any) -> TensorDict:
        """One request's input as the model's named tensors, cast and shape-checked."""
        tensors = named_tensors(self.name, value, self._input_names, self._casts)
        for name, array in tensors.items():
            shape = self._shapes.get(name)
            if shape is not None and (
                array.ndim != len(shape) or any(w not in (-1, g) for w, g in zip(shape, array.shape, strict=True))
            ):
                raise InvalidInput(
                    f"input {name!r} of model {self.name!r} has shape {list(array.shape)}",
                    expected=f"shape {list(shape)} (-1 = any)",
                )
        return tensors

    async def _run_batch(self, items: list[TensorDict], replica: int = 0) -> list[TensorDict]:
        if len(items) == 1:
            merged = items[0]
        else:
            merged = {name: np.concatenate([item[name] for item in items]) for name in self._input_names}
        if self.runs_on_loop or (self.lane is not None and self._fits_lane(merged)):
            outputs = self._predict_timed(merged, replica)  # with a lane, the batcher holds it while this runs
        else:
            outputs = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._predict_timed, merged, replica
            )
        if len(items) == 1:
            return [outputs]
        counts = [_rows(item) for item in items]
        total = sum(counts)
        for name, array in outputs.items():
            if array.shape[:1] != (total,):
                raise RuntimeError(f"model {self.name!r} output {name!r} has {array.shape[:1]} rows for {total} inputs")
        offsets = np.cumsum(counts)[:-1]
        split = {name: np.split(array, offsets) for name, array in outputs.items()}
        return [{name: parts[i] for name, parts in split.items()} for i in range(len(items))]

    def describe(self) -> dict[str, Any]:
        info = {"name": self.name, "kind": "model", "version": self.version, **self.runtime.describe()}
        info["replicas"] = [{"device": replica.options.device} for replica in self.replicas]
        info["execution"] = (
            "event loop"
            if self.runs_on_loop
            else "event loop, one job at a time (single core)"
            if self.lane is not None
            else "worker thread"
        )
        info["batching"] = None
        if self.queued:
            policy = self.policy
            batching: dict[str, Any] = {
                "max_batch_size": policy.max_batch_size,
                "max_latency_ms": policy.max_wait_s * 1000,
                "max_queue_size": policy.max_queue_size,
                "mode": policy.mode,
            }
            if policy.mode == "adaptive":
                batching["batch_overhead_ms"] = policy.batch_overhead_s * 1000
            info["batching"] = {**batching, **self._learned()}
        return info

    def learned_costs(self) -> tuple[dict[int, float], int | None]:
        """What the batcher learned so far: seconds per row by batch size, and the size adaptive mode runs under
        load (``None`` in fixed mode, or before two sizes were measured)."""
        if self._batcher is None:
            return {}, None
        latency = self._batcher.latency
        per_row = {size: seconds / size for size, seconds in sorted(latency.by_size().items())}
        best = self._batcher.best_size
        return per_row, best

    def _learned(self) -> dict[str, Any]:
        if self._batcher is None:
            return {}
        per_row, best = self.learned_costs()
        return {
            "learned_ms_per_row": {str(size): round(seconds * 1000, 3) for size, seconds in per_row.items()},
            "best_size": best,
        }


def named_tensors(node: str, value: Any, names: list[str], casts: dict[str, np.dtype[Any]]) -> TensorDict:
    """A node's input value as the model's named tensors: a dict by name, or one array for a one-input model;
    numbers cast to the dtype the model declares.

    Raises:
        InvalidInput: a missing tensor, several inputs without names, or text where numbers are expected.
    """
    if isinstance(value, dict):
        missing = [n for n in names if n not in value]
        if missing:
            raise InvalidInput(f"model node {node!r} got no tensor for {missing}", expected=f"tensors named {names}")
        tensors = {name: np.asarray(value[name]) for name in names}
    elif len(names) == 1:
        tensors = {names[0]: np.asarray(value)}
    else:
        raise InvalidInput(f"model node {node!r} takes several inputs", expected=f"a dict of tensors named {names}")
    for name, array in tensors.items():
        want = casts.get(name)
        if want is not None and array.dtype != want:
            if array.dtype.kind not in "biuf":
                raise InvalidInput(f"input {name!r} of model {node!r} is {array.dtype}", expected=f"{want} numbers")
            tensors[name] = array.astype(want)
    return tensors


def _repeat_rows(tensors: TensorDict, rows: int) -> TensorDict:
    """``tensors`` repeated along the batch dimension to ``rows`` rows."""
    out = {}
    for name, array in tensors.items():
        have = max(1, int(array.shape[0]))
        out[name] = np.concatenate([array] * -(-rows // have))[:rows]
    return out


def _rows(item: TensorDict) -> int:
    first = next(iter(item.values()))
    return int(first.shape[0]) if first.ndim else 1
