"""Composition root: settings -> spec -> service -> transport, and the process runners."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeserve._allocator import tune_allocator
from pipeserve.config import InferServerSettings, ServerSettings, WorkerSettings
from pipeserve.errors import SpecError
from pipeserve.jobs import JobWorker, RedisJobQueue, WebhookSender
from pipeserve.jobs.worker import worker_options
from pipeserve.observability import tracing
from pipeserve.observability.logging import configure_logging
from pipeserve.observability.metrics import Metrics
from pipeserve.pipeline.executor import default_worker_threads
from pipeserve.pipeline.loader import LoadedSpec, load_spec
from pipeserve.remote import RemoteModels
from pipeserve.server.rest import RestApp, create_app
from pipeserve.server.v2 import V2HttpApp, start_grpc_server
from pipeserve.service import InferenceService
from pipeserve.service.models import ModelRepository, ModelService

logger = logging.getLogger(__name__)


def build_rest_app(settings: ServerSettings) -> RestApp:
    """The REST app for ``settings.spec_dir``: spec checked and handlers imported now, models loaded at startup.

    Example:
        >>> app = build_rest_app(ServerSettings(spec_dir=Path("examples/iris")))  # doctest: +SKIP
    """
    metrics = Metrics()
    loaded = load_spec(settings.spec_dir)
    tracing.configure_tracing(f"pipeserve {loaded.spec.name}")

    def pool(urls: list[str]) -> RemoteModels:
        return RemoteModels(
            urls,
            release_check=settings.release_check,
            call_timeout_s=settings.infer_timeout_s,
            grpc_engine=settings.grpc_client,
            start_timeout_s=settings.infer_start_timeout_s,
        )

    remote = pool(settings.infer_urls) if settings.infer_urls else None
    service = InferenceService(
        loaded,
        metrics=metrics,
        warmup_runs=settings.warmup_runs,
        max_in_flight=settings.max_in_flight,
        worker_threads=settings.worker_threads or default_worker_threads(settings.workers),
        remote=remote,
        node_remotes=gateway_remotes(loaded, pool, settings.remote_urls) if settings.pattern == "gateway" else None,
    )
    return create_app(service, settings, metrics)


def gateway_remotes(
    loaded: LoadedSpec, pool: Callable[[list[str]], RemoteModels], overrides: dict[str, list[str]] | None = None
) -> dict[str, RemoteModels]:
    """Node name -> the endpoint pool of each model node the spec marks remote (``remote.url``, or where
    ``overrides`` says it is served); nodes with the same URLs share one pool.

    Raises:
        SpecError: the gateway pattern with no node marked remote, or an override for an unknown node.
    """
    overrides = overrides or {}
    names = {node.name for node in loaded.spec.nodes}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise SpecError(f"--remote names unknown nodes {unknown} (nodes: {', '.join(sorted(names))})", file=loaded.path)
    pools: dict[tuple[str, ...], RemoteModels] = {}
    remotes: dict[str, RemoteModels] = {}
    for node in loaded.spec.nodes:
        meta = node.model_load_meta
        urls = overrides.get(node.name) or (meta.remote.url if meta is not None else None)
        if meta is None or not urls or node.name in loaded.graph.unreachable:
            continue
        key = tuple(urls)
        remotes[node.name] = pools.setdefault(key, pool(list(key)))
    if not remotes:
        raise SpecError(
            "--pattern gateway: no node is marked remote; give a model node `model_load_meta.remote.url`",
            file=loaded.path,
        )
    return remotes


def _start_process(settings: ServerSettings | InferServerSettings | WorkerSettings) -> None:
    """What every server process does first: its logging, and the allocator (inherited by forked workers)."""
    configure_logging(settings.log_level, settings.log_format)
    if settings.tune_allocator:
        tune_allocator()


def serve(settings: ServerSettings) -> None:
    """Serve the REST API: uvicorn in this process for one worker, gunicorn with uvicorn workers for several."""
    _start_process(settings)
    load_spec(settings.spec_dir)  # fail here, with the spec's error, before any process starts
    if settings.workers == 1:
        _serve_uvicorn(settings)
    else:
        _serve_gunicorn(settings)


def _uvicorn_options(settings: ServerSettings | InferServerSettings) -> dict[str, Any]:
    return {
        "log_config": None,
        "access_log": False,  # our own access line carries the request id and latency
        "server_header": False,
        "lifespan": "on",
        "timeout_graceful_shutdown": int(settings.graceful_timeout_s),
    }


def _serve_uvicorn(settings: ServerSettings) -> None:
    import uvicorn

    config = uvicorn.Config(
        build_rest_app(settings),
        host=settings.host,
        port=settings.port,
        backlog=settings.backlog,
        limit_max_requests=settings.limit_max_requests,
        **_uvicorn_options(settings),
    )
    logger.info("Serving %s on http://%s:%d (1 worker)", settings.spec_dir, settings.host, settings.port)
    uvicorn.Server(config).run()


def _serve_gunicorn(settings: ServerSettings) -> None:
    try:
        from gunicorn.app.base import BaseApplication
    except ImportError as exc:
        raise RuntimeError("several workers need gunicorn: pip install 'pipeserve[gunicorn]'") from exc

    class PipeserveGunicorn(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            options = {
                "bind": f"{settings.host}:{settings.port}",
                "workers": settings.workers,
                "worker_class": "pipeserve.server.rest._gunicorn.PipeserveWorker",
                "backlog": settings.backlog,
                "max_requests": settings.limit_max_requests or 0,
                "max_requests_jitter": settings.max_requests_jitter,
                "graceful_timeout": int(settings.graceful_timeout_s),
                "timeout": 120,
                "loglevel": "debug" if settings.log_level == "trace" else settings.log_level,
                "accesslog": None,
                "proc_name": f"pipeserve-{settings.spec_dir.name}",
            }
            options["child_exit"] = self.child_exit
            for key, value in options.items():
                self.cfg.set(key, value)

        def child_exit(self, server: Any, worker: Any) -> None:
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]

        def load(self) -> RestApp:
            # Runs in each worker after the fork: every worker loads its own models in its lifespan.
            configure_logging(settings.log_level, settings.log_format)
            return build_rest_app(settings)

    logger.info(
        "Serving %s on http://%s:%d (%d workers, pid %d)",
        settings.spec_dir,
        settings.host,
        settings.port,
        settings.workers,
        os.getpid(),
    )
    PipeserveGunicorn().run()


async def check_pipeline(spec_dir: Path | str) -> dict[str, Any]:
    """Load, warm up and golden-check a pipeline without serving it; report what happened.

    Raises:
        SpecError: the spec is invalid or a node cannot load.
    """
    loaded = load_spec(spec_dir)
    service = InferenceService(loaded)
    await service.start()
    try:
        return {
            "pipeline": loaded.spec.name,
            "spec": str(loaded.path),
            "order": " -> ".join(loaded.plan.order),
            "fingerprint": service.fingerprint,
            "golden": service.golden_summary,
            "ready": service.is_ready,
            "reason": service.reason,
            "warnings": list(loaded.warnings),
        }
    finally:
        await service.stop()


def build_model_service(settings: InferServerSettings, metrics: Metrics | None = None) -> ModelService:
    """The models to serve: the spec's model nodes (the release), or a NAME/VERSION/ repository."""
    if (settings.spec_dir is None) == (settings.repository is None):
        raise SpecError("give either a spec directory or --repository (not both)")
    if settings.spec_dir is not None:
        only = [m.strip() for m in settings.models.split(",")] if settings.models else None
        repository = ModelRepository.from_spec(load_spec(settings.spec_dir), only=only)
    else:
        assert settings.repository is not None
        repository = ModelRepository.from_directory(settings.repository)
    return ModelService(
        repository,
        metrics=metrics,
        warmup_runs=settings.warmup_runs,
        worker_threads=settings.worker_threads,
        max_in_flight=settings.max_in_flight,
        server_version=_version(),
    )


def serve_infer(settings: InferServerSettings) -> None:
    """Serve v2 HTTP (uvicorn) and gRPC from one event loop until SIGINT/SIGTERM."""
    _start_process(settings)
    asyncio.run(_serve_infer(settings))


async def _serve_infer(settings: InferServerSettings) -> None:
    import uvicorn

    metrics = Metrics()
    service = build_model_service(settings, metrics)
    names = ",".join(sorted(service.repository.models))
    tracing.configure_tracing(f"pipeserve infer {names}")
    grpc_server = await start_grpc_server(service, settings.host, settings.grpc_port, engine=settings.grpc_server)

    async def startup() -> None:
        await service.start()
        logger.info(
            "Inference server ready: http://%s:%d/v2, gRPC %s:%d (%s)",
            settings.host,
            settings.http_port,
            settings.host,
            settings.grpc_port,
            service.repository.description,
        )

    async def shutdown() -> None:
        await grpc_server.stop(settings.graceful_timeout_s)
        await service.stop(settings.graceful_timeout_s)
        tracing.shutdown_tracing()

    app = V2HttpApp(
        service,
        max_body_bytes=settings.max_body_bytes,
        default_timeout_s=settings.request_timeout_s,
        metrics_render=metrics.render,
        on_startup=startup,
        on_shutdown=shutdown,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.http_port,
        **_uvicorn_options(settings),
    )
    await uvicorn.Server(config).serve()


def run_worker(settings: WorkerSettings) -> int:
    """Run jobs from the Redis queue until SIGINT/SIGTERM; the exit code (1: the pipeline never became ready)."""
    _start_process(settings)
    return asyncio.run(_run_worker(settings))


async def _run_worker(settings: WorkerSettings) -> int:
    loaded = load_spec(settings.spec_dir)
    tracing.configure_tracing(f"pipeserve worker {loaded.spec.name}")
    service = InferenceService(
        loaded,
        warmup_runs=settings.warmup_runs,
        max_in_flight=settings.max_in_flight,
        worker_threads=settings.worker_threads,
    )
    await service.start()
    if not service.is_ready:  # never run jobs with a pipeline that failed its golden check
        logger.error("Pipeline %s is not ready, so this worker takes no jobs: %s", loaded.spec.name, service.reason)
        await service.stop()
        return 1
    name = settings.name or f"{socket.gethostname()}-{os.getpid()}"
    queue = RedisJobQueue(
        settings.redis_url,
        pipeline=loaded.spec.name,
        release=service.fingerprint or "unknown",
        result_ttl_s=settings.jobs.result_ttl_s,
        visibility_timeout_s=settings.jobs.visibility_timeout_s,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await queue.start()
        worker = JobWorker(
            service,
            queue,
            name=name,
            options=worker_options(settings.jobs, service),
            webhooks=WebhookSender(attempts=settings.jobs.webhook_attempts),
        )
        await worker.start()
        logger.info(
            "Worker %s: running %s jobs from %s (stream %s, %d at a time)",
            name,
            loaded.spec.name,
            queue.location,
            queue.stream,
            worker.options.concurrency,
        )
        await stop.wait()
        logger.info("Worker %s stopping: finishing the jobs in progress", name)
        await worker.stop(settings.graceful_timeout_s)
    finally:
        await queue.stop()
        await service.stop(settings.graceful_timeout_s)
        tracing.shutdown_tracing()
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pipeserve")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "0+unknown"
