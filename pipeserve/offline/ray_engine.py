"""``--engine ray``: the same pipeline over Ray Data (``map_batches`` with one pipeline per actor), for inputs that
outgrow one machine. The driver lists the records (image paths, not bytes: actors read the files themselves, so
on a cluster the input must be on storage every node sees) and writes the results as the local engine does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import orjson

from pipeserve.offline.io import Record
from pipeserve.offline.scorer import ChunkScorer, Outcomes, ScoreOptions, ScoringFailed

logger = logging.getLogger(__name__)


class RayPipelineScorer:
    """A Ray Data actor: loads the pipeline once (warm-up, golden check), then scores batches of records."""

    def __init__(self, spec_dir: str, endpoint: str, label: bool, params: dict[str, str]) -> None:
        from pipeserve.pipeline.loader import load_spec
        from pipeserve.service import InferenceService

        self._loop = asyncio.new_event_loop()
        service = InferenceService(load_spec(spec_dir), worker_threads=1, max_in_flight=1_000_000)
        self._loop.run_until_complete(service.start())
        if not service.is_ready:
            raise RuntimeError(f"the pipeline is not ready: {service.reason}")
        self._scorer = ChunkScorer(service, endpoint, label, params)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        records = [
            Record(
                str(key),
                orjson.loads(data) if data else None,
                problem=str(problem) or None,
                path=str(path) or None,
            )
            for key, data, problem, path in zip(
                batch["key"], batch["data"], batch["problem"], batch["path"], strict=True
            )
        ]
        outcomes = self._loop.run_until_complete(self._scorer.score(records))
        return {
            "key": [key for key, _, _ in outcomes],
            "prediction": [prediction.decode() if prediction is not None else "" for _, prediction, _ in outcomes],
            "error": [error or "" for _, _, error in outcomes],
        }


def _row(record: Record) -> dict[str, str]:
    data = "" if record.data is None else orjson.dumps(record.data).decode()
    return {"key": record.key, "data": data, "problem": record.problem or "", "path": record.path or ""}


def score_with_ray(options: ScoreOptions, records: Iterator[Record]) -> Iterator[Outcomes]:
    """Outcomes chunk by chunk, in input order, from a Ray Data pipeline on ``options.ray_address`` (a local Ray
    instance when unset)."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise ScoringFailed("--engine ray needs Ray Data: pip install 'pipeserve[ray]'") from exc
    rows = [_row(record) for record in records]
    if not rows:
        return
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(
            address=options.ray_address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
        )
    try:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False
        cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
        workers = options.workers or max(1, int(cpus))
        dataset = ray.data.from_items(rows, override_num_blocks=max(1, min(len(rows) // options.chunk_size, 200)))
        scored = dataset.map_batches(
            RayPipelineScorer,
            fn_constructor_args=(str(options.spec_dir), options.endpoint, options.label, dict(options.params)),
            batch_size=options.chunk_size,
            batch_format="numpy",
            concurrency=workers,
            num_cpus=1,
        )
        for batch in scored.iter_batches(batch_size=options.chunk_size, batch_format="numpy"):
            yield [
                (str(key), prediction.encode() if not error else None, str(error) or None)
                for key, prediction, error in zip(batch["key"], batch["prediction"], batch["error"], strict=True)
            ]
    finally:
        if started_here:
            ray.shutdown()
