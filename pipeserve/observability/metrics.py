"""Prometheus metrics, one registry per app so that several apps can live in one process (tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

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
        self.registry = registry or CollectorRegistry(auto_describe=True)
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
        self.ready = Gauge(
            "pipeserve_ready",
            "1 when the pipeline is loaded, warm and golden-checked.",
            ["pipeline"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
