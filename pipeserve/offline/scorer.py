"""Offline batch scoring: reader -> bounded queue -> N worker processes -> ordered, resumable writer.

Each worker process loads the pipeline once (warm-up and golden check included, as a server would) and scores
chunks of records concurrently, so they reach the models' batchers together. The parent reads the input, skips
what a previous run already wrote, hands chunks out, writes the results in input order (flushed to disk after
every chunk) and shows progress. Records that fail go to the errors file with the reason; the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeserve._allocator import tune_allocator
from pipeserve.errors import InvalidInput, NodeFailed, PipeserveError
from pipeserve.offline.io import (
    InputOptions,
    Record,
    ResultWriter,
    count_records,
    detect_format,
    load_image,
    read_records,
)

logger = logging.getLogger(__name__)

Engine = Literal["local", "ray"]
#: (chunk number, [(key, prediction JSON or None, error or None), ...])
Outcomes = list[tuple[str, bytes | None, str | None]]


class ScoringFailed(PipeserveError):
    """The run stopped before the end (a worker died, the pipeline is not ready); what was written is kept."""


@dataclass(frozen=True, slots=True)
class ScoreOptions:
    """One offline run.

    Attributes:
        workers: scoring processes (default: the cores this process may use); with one per core, each is pinned
            to its core and runs its pipeline on one core, as a single-core server does.
        chunk_size: records a worker scores together (they meet in the models' batchers).
        endpoint: the endpoint whose output is written (``predict``, or a name under the spec's ``endpoints``).
        label: write class names, as ``/predict/label`` answers.
        params: query parameters for the steps (``{"k": "5"}`` for ``top_k``).
    """

    spec_dir: Path
    input: Path
    output: Path
    errors: Path | None = None
    workers: int | None = None
    chunk_size: int = 32
    endpoint: str = "predict"
    label: bool = False
    params: dict[str, str] = field(default_factory=dict)
    input_options: InputOptions = field(default_factory=InputOptions)
    progress: bool = True
    engine: Engine = "local"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")


@dataclass(slots=True)
class ScoreReport:
    """What a run did: records in the input, skipped as already done, scored now, failed now; and how fast."""

    total: int = 0
    skipped: int = 0
    scored: int = 0
    failed: int = 0
    seconds: float = 0.0
    startup_s: float = 0.0
    output: str = ""
    errors: str = ""

    @property
    def records_per_s(self) -> float:
        """Records per second once the workers were ready (loading and warming up the models excluded)."""
        done = self.scored + self.failed
        scoring = self.seconds - self.startup_s
        return done / scoring if scoring > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "skipped": self.skipped,
            "scored": self.scored,
            "failed": self.failed,
            "seconds": round(self.seconds, 3),
            "startup_s": round(self.startup_s, 3),
            "records_per_s": round(self.records_per_s, 2),
            "output": self.output,
            "errors": self.errors,
        }


def _available_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


def score(options: ScoreOptions) -> ScoreReport:
    """Score ``options.input`` into ``options.output`` (resuming a previous run); see the module docstring.

    Raises:
        SpecError: a bad spec, input or option.
        ScoringFailed: the run could not finish (what was written stays; rerun to resume).
    """
    from pipeserve.pipeline.loader import load_spec

    loaded = load_spec(options.spec_dir)
    kind = loaded.spec.input.kind
    fmt = detect_format(options.input)
    writer = ResultWriter(options.output, options.errors)
    report = ScoreReport(output=str(writer.output), errors=str(writer.errors))
    report.total = count_records(options.input, fmt) or 0
    report.skipped = len(writer.done)
    if writer.done:
        logger.info("Resuming: %d records already in %s and %s", len(writer.done), writer.output, writer.errors)
    records = (r for r in read_records(options.input, fmt, kind, options.input_options) if r.key not in writer.done)
    progress = _progress(options, report)
    started = time.perf_counter()
    try:
        if options.engine == "ray":
            from pipeserve.offline.ray_engine import score_with_ray

            outcomes = score_with_ray(options, records)
        else:

            def ready() -> None:
                report.startup_s = time.perf_counter() - started

            outcomes = _score_locally(options, records, ready)
        for chunk in outcomes:
            for key, prediction, error in chunk:
                if error is None:
                    assert prediction is not None
                    writer.write_result(key, prediction)
                else:
                    writer.write_error(key, error)
            writer.flush()
            progress.update(len(chunk))
    finally:
        writer.close()
        progress.close()
        report.seconds = time.perf_counter() - started
        report.scored, report.failed = writer.written, writer.failed
    return report


def _progress(options: ScoreOptions, report: ScoreReport) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=report.total or None,
        initial=report.skipped,
        unit="rec",
        desc=f"scoring {options.input.name}",
        disable=not options.progress,
        file=sys.stderr,
        dynamic_ncols=True,
        smoothing=0.1,
    )


def _chunks(records: Iterator[Record], size: int) -> Iterator[list[Record]]:
    chunk: list[Record] = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _score_locally(options: ScoreOptions, records: Iterator[Record], ready: Callable[[], None]) -> Iterator[Outcomes]:
    """Worker processes score the chunks; the outcomes come back in input order."""
    cores = _available_cores()
    workers = options.workers or len(cores)
    pin = workers == len(cores)
    threads = max(1, len(cores) // workers)
    context = multiprocessing.get_context("spawn")  # no fork: engines and threads do not survive it
    tasks: Any = context.Queue(maxsize=2 * workers)
    results: Any = context.Queue()
    processes = [
        context.Process(
            target=_worker_main,
            args=(options, tasks, results, cores[i] if pin else None, threads),
            name=f"pipeserve-score-{i}",
            daemon=True,
        )
        for i in range(workers)
    ]
    for process in processes:
        process.start()
    stop = threading.Event()
    try:
        _wait_ready(processes, results, workers)
        ready()
        feeder = threading.Thread(
            target=_feed, args=(_chunks(records, options.chunk_size), tasks, workers, stop), daemon=True
        )
        feeder.start()
        pending: dict[int, Outcomes] = {}
        next_seq = 0
        finished = 0
        while finished < workers:
            message = _next_result(processes, results)
            if message[0] == "done":
                finished += 1
                continue
            seq, outcomes = message[1], message[2]
            pending[seq] = outcomes
            while next_seq in pending:
                yield pending.pop(next_seq)
                next_seq += 1
    finally:
        stop.set()
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(timeout=10)


def _wait_ready(processes: list[Any], results: Any, workers: int) -> None:
    ready = 0
    while ready < workers:
        message = _next_result(processes, results, timeout_s=600)
        if message[0] == "fatal":
            raise ScoringFailed(f"a scoring worker could not start: {message[1]}")
        if message[0] == "ready":
            ready += 1


def _next_result(processes: list[Any], results: Any, timeout_s: float = 3600) -> tuple[Any, ...]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            message: tuple[Any, ...] = results.get(timeout=1.0)
            return message
        except queue.Empty:
            dead = [p for p in processes if not p.is_alive() and p.exitcode not in (0, None)]
            if dead:
                raise ScoringFailed(
                    f"scoring worker {dead[0].name} died (exit code {dead[0].exitcode}); every result before it is "
                    "written: run the same command again to resume"
                ) from None
            if time.monotonic() > deadline:
                raise ScoringFailed(f"no scoring result for {timeout_s:.0f}s") from None


def _feed(chunks: Iterator[list[Record]], tasks: Any, workers: int, stop: threading.Event) -> None:
    """Hand out the chunks (the bounded queue holds the reader back), then one stop marker per worker."""
    for seq, chunk in enumerate(chunks):
        while not stop.is_set():
            try:
                tasks.put((seq, chunk), timeout=0.5)
                break
            except queue.Full:
                continue
        if stop.is_set():
            return
    for _ in range(workers):
        tasks.put(None)


def _worker_main(options: ScoreOptions, tasks: Any, results: Any, cpu: int | None, threads: int) -> None:
    if cpu is not None:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, {cpu})
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    tune_allocator()
    asyncio.run(_worker_loop(options, tasks, results, threads))


async def _worker_loop(options: ScoreOptions, tasks: Any, results: Any, threads: int) -> None:
    from pipeserve.pipeline.loader import load_spec
    from pipeserve.service import InferenceService

    try:
        service = InferenceService(load_spec(options.spec_dir), worker_threads=threads, max_in_flight=1_000_000)
        await service.start()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops the run
        results.put(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    if not service.is_ready:
        results.put(("fatal", f"the pipeline is not ready: {service.reason}"))
        await service.stop()
        return
    scorer = ChunkScorer(service, options.endpoint, options.label, options.params)
    results.put(("ready", os.getpid()))
    try:
        while True:
            task = tasks.get()
            if task is None:
                break
            seq, chunk = task
            results.put(("chunk", seq, await scorer.score(chunk)))
    finally:
        await service.stop()
        results.put(("done",))


class ChunkScorer:
    """Scores records with a started service, all of a chunk at once; every record gets a result or an error."""

    def __init__(self, service: Any, endpoint: str, label: bool, params: dict[str, str]) -> None:
        self.service = service
        self.endpoint = endpoint
        self.label = label
        self.params = params or None

    async def score(self, chunk: list[Record]) -> Outcomes:
        return list(await asyncio.gather(*(self._one(load_image(record)) for record in chunk)))

    async def _one(self, record: Record) -> tuple[str, bytes | None, str | None]:
        from pipeserve.pipeline.codec import dump_json

        if record.problem is not None:
            return record.key, None, record.problem
        try:
            if self.label:
                value = await self.service.predict_label(record.data, timeout_s=None)
            else:
                value = await self.service.predict(record.data, self.endpoint, self.params, timeout_s=None)
        except InvalidInput as exc:
            return record.key, None, str(exc)
        except NodeFailed as exc:
            cause = exc.cause
            return record.key, None, f"node {exc.node!r} failed: {type(cause).__name__}: {cause}"
        except PipeserveError as exc:
            return record.key, None, f"{type(exc).__name__}: {exc}"
        return record.key, dump_json(value), None
