"""Prometheus metrics, one registry per app so that several apps can live in one process (tests)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: Batches between two updates of the learned-cost gauges (the first batch updates them too).
LEARNED_EVERY = 16
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]


class Metrics:
    """The metrics one server exports.

    Example:
        >>> m = Metrics()
        >>> m.requests.labels(route="/predict", method="POST", status="200").inc()
        >>> b"pipeserve_requests_total" in m.render()
        True
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # The *_created series double the output and nobody graphs them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry or CollectorRegistry(auto_describe=True)
        # With several workers (gunicorn), PROMETHEUS_MULTIPROC_DIR is set before they fork: values live in
        # per-process files and /metrics sums them over every live worker, whichever worker answers.
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if self.multiprocess_dir and values.ValueClass is values.MutexValue:
            # prometheus_client picks its value class when first imported; if that happened before the CLI set
            # the directory (any import of pipeserve does), pick again so these metrics go to the shared files.
            values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
        self.requests = Counter(
            "pipeserve_requests",
            "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.request_latency = Histogram(
            "pipeserve_request_latency_seconds",
            "Time from receiving a request to sending its response, by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.node_latency = Histogram(
            "pipeserve_node_latency_seconds",
            "Time spent in each pipeline node per request.",
            ["pipeline", "node"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.node_errors = Counter(
            "pipeserve_node_errors",
            "Errors raised by pipeline nodes.",
            ["pipeline", "node"],
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "pipeserve_batch_size",
            "Rows per batch run by a model's batcher.",
            ["pipeline", "model"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=self.registry,
        )
        self.batch_queue_wait = Histogram(
            "pipeserve_batch_queue_wait_seconds",
            "How long the oldest request of each batch waited in the queue.",
            ["pipeline", "model"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.batch_run = Histogram(
            "pipeserve_batch_run_seconds",
            "How long each batch took to run (engine time, thread hop included).",
            ["pipeline", "model"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.batch_learned = Gauge(
            "pipeserve_batch_learned_seconds_per_row",
            "What a model's batcher learned: run time per row at each batch size it measured (the median of its "
            "last runs). Adaptive mode runs the cheapest.",
            ["pipeline", "model", "size"],
            registry=self.registry,
            multiprocess_mode="liveall",
        )
        self.batch_best_size = Gauge(
            "pipeserve_batch_best_size",
            "The batch size an adaptive batcher runs under load (the cheapest per row it measured).",
            ["pipeline", "model"],
            registry=self.registry,
            multiprocess_mode="liveall",
        )
        self.ready = Gauge(
            "pipeserve_ready",
            "1 when the pipeline is loaded, warm and golden-checked (the minimum over live workers).",
            ["pipeline"],
            registry=self.registry,
            multiprocess_mode="livemin",
        )

    def batch_observer(self, pipeline: str, model: str) -> Callable[[Any, Any], None]:
        """The ``on_batch`` callback for one model's batcher: the batch histograms on every batch and, every
        ``LEARNED_EVERY`` batches, the learned cost gauges (from the node's ``learned_costs()``, when it has one)."""
        size = self.batch_size.labels(pipeline=pipeline, model=model)
        wait = self.batch_queue_wait.labels(pipeline=pipeline, model=model)
        run = self.batch_run.labels(pipeline=pipeline, model=model)
        per_row_gauges: dict[int, Any] = {}  # created when first set: a series at 0 would read as a cost
        batches = 0

        def on_batch(node: Any, info: Any) -> None:
            nonlocal batches
            size.observe(info.size)
            wait.observe(info.queue_wait_s)
            run.observe(info.run_s)
            batches += 1
            learned = getattr(node, "learned_costs", None)
            if learned is None or (batches - 1) % LEARNED_EVERY:
                return
            per_row, best_size = learned()
            for rows, seconds in per_row.items():
                gauge = per_row_gauges.get(rows)
                if gauge is None:
                    gauge = per_row_gauges[rows] = self.batch_learned.labels(
                        pipeline=pipeline, model=model, size=str(rows)
                    )
                gauge.set(seconds)
            if best_size is not None:
                self.batch_best_size.labels(pipeline=pipeline, model=model).set(best_size)

        return on_batch

    def render(self) -> bytes:
        """The registry (or, with several workers, all workers' values) in Prometheus text format."""
        if self.multiprocess_dir:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)
