"""Server settings, built once at startup and passed down.

Every field reads ``PIPESERVE_<NAME>`` from the environment; the seed services' variables (``HOST``,
``PORT``, ``WORKERS``, ``BACKLOG``, ``LIMIT_MAX_REQUESTS``, ``MAX_REQUESTS_JITTER``, ``GRACEFUL_TIMEOUT``,
``LOGLEVEL``) are honoured too. Explicit arguments (the CLI's options) win over both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]


def _env(name: str, seed_name: str) -> AliasChoices:
    """PIPESERVE_<NAME> first, then the seed services' variable."""
    return AliasChoices(f"PIPESERVE_{name.upper()}", seed_name)


#: Which gRPC server an inference server runs (``pipeserve.server.v2.grpc.start_grpc_server``).
GrpcEngine = Literal["native", "grpcio"]


class _ProcessSettings(BaseSettings):
    """What every pipeserve server process shares: bind address, logging, threads, deadlines, shutdown."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True, frozen=True, env_prefix="PIPESERVE_")

    host: str = Field(default="127.0.0.1", validation_alias=_env("host", "HOST"))
    graceful_timeout_s: float = Field(
        default=10.0, ge=0, validation_alias=_env("graceful_timeout_s", "GRACEFUL_TIMEOUT")
    )
    log_level: LogLevel = Field(default="info", validation_alias=_env("log_level", "LOGLEVEL"))
    log_format: Literal["json", "text"] = Field(default="json")
    worker_threads: int | None = Field(
        default=None, ge=1, le=256, description="Threads for CPU-bound node work; default: cores / workers."
    )
    request_timeout_s: float | None = Field(
        default=60.0,
        gt=0,
        description="A request's deadline unless it sends X-Request-Timeout-Ms; queued work past it never runs (504).",
    )
    tune_allocator: bool = Field(
        default=True,
        description="Keep large freed buffers in glibc's heap instead of faulting them in again per request.",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class JobSettings(BaseSettings):
    """The asynchronous job API and its workers (``PIPESERVE_JOB_<NAME>``)."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True, frozen=True, env_prefix="PIPESERVE_JOB_")

    max_queued: int = Field(default=10_000, ge=1, description="Jobs waiting or running; more get 503 + Retry-After.")
    result_ttl_s: float = Field(default=86_400.0, gt=0, description="How long a finished job's result is kept.")
    concurrency: int | None = Field(
        default=None, ge=1, le=4096, description="Jobs a worker runs at once; default: twice the largest batch."
    )
    max_attempts: int = Field(default=3, ge=1, le=100, description="Runs of a failing job before the dead letters.")
    visibility_timeout_s: float = Field(
        default=60.0, gt=0, description="A job pending this long on a silent worker is received by another."
    )
    timeout_s: float = Field(default=300.0, gt=0, description="A job's deadline once a worker starts it.")
    webhook_attempts: int = Field(default=5, ge=1, le=50, description="Sends of a webhook before giving up.")
    webhook_lease_s: float = Field(
        default=90.0, gt=0, description="A worker sending a webhook holds it this long; then another may resend it."
    )


class ServerSettings(_ProcessSettings):
    """How one pipeserve server runs.

    Example:
        >>> ServerSettings(spec_dir=Path("examples/iris"), port=8001).port
        8001
    """

    spec_dir: Path = Field(default=Path("."))
    port: int = Field(default=8000, ge=0, le=65535, validation_alias=_env("port", "PORT"))
    workers: int = Field(default=1, ge=1, le=256, validation_alias=_env("workers", "WORKERS"))
    backlog: int = Field(default=2048, ge=1, validation_alias=_env("backlog", "BACKLOG"))
    limit_max_requests: int | None = Field(
        default=None, ge=1, validation_alias=_env("limit_max_requests", "LIMIT_MAX_REQUESTS")
    )
    max_requests_jitter: int = Field(
        default=0, ge=0, validation_alias=_env("max_requests_jitter", "MAX_REQUESTS_JITTER")
    )
    access_log: bool = Field(default=True)
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    max_in_flight: int = Field(default=256, ge=1, description="Predictions in progress at once; more get 503.")
    warmup_runs: int = Field(default=5, ge=0, le=1000)
    root_path: str = Field(default="")
    pattern: Literal["single", "gateway"] = Field(
        default="single",
        description="single: every node in this process (or --infer for the models). gateway: nodes marked "
        "`remote.url` are called there, the rest run here.",
    )
    remote: str | None = Field(
        default=None,
        description="Gateway: where remote nodes are served, overriding their remote.url: "
        "'NODE=URL[,URL...];NODE=...' (e.g. container names in a compose file).",
    )
    infer: str | None = Field(
        default=None,
        description="Comma-separated v2 inference endpoints (grpc://host:port or http://host:port) that serve the "
        "model nodes: the preprocessing server of the split. Unset: models run in-process.",
    )
    release_check: Literal["fingerprint", "golden"] = Field(
        default="fingerprint",
        description="fingerprint: endpoints must report this spec's release fingerprint; golden: accept servers "
        "that report none (MLServer, Triton), relying on the golden check across the split at warm-up.",
    )
    infer_timeout_s: float = Field(default=30.0, gt=0, description="Longest wait for one inference call.")
    grpc_client: GrpcEngine = Field(
        default="native",
        description="How grpc:// endpoints are called: native (from the event loop) or grpcio (grpc.aio's channel).",
    )
    infer_start_timeout_s: float = Field(
        default=60.0, gt=0, description="How long startup waits for an inference endpoint serving our release."
    )
    redis_url: str | None = Field(
        default=None,
        description="The job queue on Redis (redis://host:6379/0): POST /jobs enqueues there and `pipeserve worker` "
        "processes run the jobs. Unset: an in-process queue and worker (single machine only).",
    )
    jobs: JobSettings = Field(default_factory=lambda: JobSettings())

    @property
    def remote_urls(self) -> dict[str, list[str]]:
        """``--remote`` as node -> URLs."""
        found: dict[str, list[str]] = {}
        for part in (self.remote or "").split(";"):
            if part.strip():
                node, _, urls = part.partition("=")
                found[node.strip()] = [url.strip() for url in urls.split(",") if url.strip()]
        return found

    @property
    def infer_urls(self) -> list[str]:
        return [url.strip() for url in (self.infer or "").split(",") if url.strip()]

    @field_validator("spec_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()


class WorkerSettings(_ProcessSettings):
    """How one job worker runs (``pipeserve worker``).

    Example:
        >>> WorkerSettings(spec_dir=Path("examples/iris"), redis_url="redis://127.0.0.1:6379/0").jobs.max_attempts
        3
    """

    spec_dir: Path = Field(default=Path("."))
    redis_url: str = Field(description="The job queue (redis://host:6379/0).")
    name: str | None = Field(default=None, description="This worker's consumer name; default: host-pid.")
    warmup_runs: int = Field(default=5, ge=0, le=1000)
    max_in_flight: int = Field(default=4096, ge=1)
    jobs: JobSettings = Field(default_factory=lambda: JobSettings())

    @field_validator("spec_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()


class InferServerSettings(_ProcessSettings):
    """How one v2 inference server runs (``pipeserve serve-infer``): HTTP and gRPC in one process.

    Example:
        >>> InferServerSettings(spec_dir=Path("examples/iris")).grpc_port
        50051
    """

    spec_dir: Path | None = Field(default=None, description="Serve this spec's model nodes (the release).")
    repository: Path | None = Field(default=None, description="Or serve a NAME/VERSION/ model repository.")
    models: str | None = Field(default=None, description="Comma-separated model nodes to serve (default: all).")
    http_port: int = Field(default=8012, ge=0, le=65535)
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    max_in_flight: int = Field(default=512, ge=1)
    warmup_runs: int = Field(default=3, ge=0, le=1000)
    grpc_server: GrpcEngine = Field(
        default="native",
        description="native: gRPC served on the event loop; grpcio: grpc.aio's server (threads of its own).",
    )

    @field_validator("spec_dir", "repository")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().resolve()
