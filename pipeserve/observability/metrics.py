"""Prometheus metrics, one registry per app so that several apps can live in one process (tests)."""

from __future__ import annotations

import os

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
        self.ready = Gauge(
            "pipeserve_ready",
            "1 when the pipeline is loaded, warm and golden-checked (the minimum over live workers).",
            ["pipeline"],
            registry=self.registry,
            multiprocess_mode="livemin",
        )

    def render(self) -> bytes:
        """The registry (or, with several workers, all workers' values) in Prometheus text format."""
        if self.multiprocess_dir:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)
