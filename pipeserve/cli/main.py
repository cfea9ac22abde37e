"""``pipeserve serve`` and ``pipeserve check``: each parses options and calls one library function."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from pipeserve.cli._errors import CheckFailed, SpecInvalid
from pipeserve.config import InferServerSettings, ServerSettings
from pipeserve.errors import SpecError

S = TypeVar("S", bound=BaseSettings)

SPEC_DIR = click.argument("spec_dir", type=click.Path(exists=True, path_type=Path))


def _settings(cls: type[S], **options: Any) -> S:
    """Settings from the options given on the command line (the rest from the environment and defaults)."""
    given = {key: value for key, value in options.items() if value is not None}
    try:
        return cls(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise click.BadParameter(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from exc


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "PIPESERVE"})
@click.version_option(package_name="pipeserve")
def cli() -> None:
    """Serve ML pipelines: one spec, every serving pattern."""


@cli.command()
@SPEC_DIR
@click.option("--host", default=None, help="Bind address [env HOST; default 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Port [env PORT; default 8000].")
@click.option("--workers", type=int, default=None, help="Processes; >1 runs gunicorn [env WORKERS; default 1].")
@click.option("--log-level", default=None, help="critical|error|warning|info|debug [env LOGLEVEL; default info].")
@click.option("--log-format", type=click.Choice(["json", "text"]), default=None, help="Log line format [json].")
@click.option("--max-body-bytes", type=int, default=None, help="Largest request body [10 MB].")
@click.option(
    "--infer",
    default=None,
    help="v2 inference endpoints serving the model nodes, comma-separated (grpc://HOST:PORT or http://HOST:PORT): "
    "run as the preprocessing server of the split [env PIPESERVE_INFER].",
)
@click.option(
    "--release-check",
    type=click.Choice(["fingerprint", "golden"]),
    default=None,
    help="How --infer endpoints are checked: the release fingerprint (pipeserve servers) or only the golden "
    "check at warm-up (MLServer, Triton) [fingerprint].",
)
@click.option(
    "--grpc-client",
    type=click.Choice(["native", "grpcio"]),
    default=None,
    help="How grpc:// endpoints are called: native (from the event loop) or grpcio (grpc.aio's channel) [native].",
)
@click.option(
    "--pattern",
    type=click.Choice(["single", "gateway"]),
    default=None,
    help="single: run every node here [default]. gateway: call the nodes the spec marks remote (remote.url).",
)
@click.option(
    "--remote",
    default=None,
    help="Gateway: where remote nodes are served, overriding the spec's remote.url: "
    "'NODE=URL[,URL];NODE=URL' [env PIPESERVE_REMOTE].",
)
@click.option(
    "--redis",
    "redis_url",
    default=None,
    help="Put POST /jobs on this Redis queue (redis://HOST:6379/0), for `pipeserve worker` processes to run; "
    "without it, jobs run in this process [env PIPESERVE_REDIS_URL].",
)
def serve(spec_dir: Path, **options: Any) -> None:
    """Serve the pipeline in SPEC_DIR over REST (the web-single pattern)."""
    settings = _settings(ServerSettings, spec_dir=spec_dir, **options)
    with _metrics_shared_by_workers(settings.workers):
        from pipeserve.app import serve as run_server  # after the env is set: prometheus reads it at import

        try:
            run_server(settings)
        except SpecError as exc:
            raise SpecInvalid(str(exc)) from exc


@cli.command("serve-infer")
@click.argument("spec_dir", required=False, type=click.Path(exists=True, path_type=Path))
@click.option("--repository", type=click.Path(exists=True, path_type=Path), help="Serve a NAME/VERSION/ repository.")
@click.option("--models", default=None, help="Serve only these model nodes of SPEC_DIR (comma-separated).")
@click.option("--host", default=None, help="Bind address [env HOST; default 127.0.0.1].")
@click.option("--http-port", type=int, default=None, help="v2 HTTP port [8012].")
@click.option("--grpc-port", type=int, default=None, help="v2 gRPC port [50051].")
@click.option(
    "--grpc-server",
    type=click.Choice(["native", "grpcio"]),
    default=None,
    help="native: gRPC on the event loop; grpcio: grpc.aio's server [native].",
)
@click.option("--log-level", default=None, help="critical|error|warning|info|debug [env LOGLEVEL; default info].")
@click.option("--log-format", type=click.Choice(["json", "text"]), default=None, help="Log line format [json].")
def serve_infer(spec_dir: Path | None, **options: Any) -> None:
    """Serve the model nodes of SPEC_DIR (or a --repository) over the Open Inference Protocol, HTTP and gRPC."""
    settings = _settings(InferServerSettings, spec_dir=spec_dir, **options)
    from pipeserve.app import serve_infer as run_server

    try:
        run_server(settings)
    except SpecError as exc:
        raise SpecInvalid(str(exc)) from exc


@cli.command()
@SPEC_DIR
@click.option(
    "--pattern",
    type=click.Choice(["prep-pred", "microservices"]),
    default="prep-pred",
    show_default=True,
    help="prep-pred: inference server(s) + a preprocessing server calling them over gRPC. microservices: a "
    "service per node the spec marks remote (at its remote.url) + a gateway on --prep-port.",
)
@click.option("--infer-replicas", type=click.IntRange(1, 64), default=1, show_default=True)
@click.option("--prep-workers", type=click.IntRange(1, 256), default=1, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--prep-port", type=int, default=8011, show_default=True)
@click.option("--infer-http-port", type=int, default=8012, show_default=True, help="First replica's; +1 per replica.")
@click.option("--infer-grpc-port", type=int, default=50051, show_default=True, help="First replica's; +1 per replica.")
@click.option(
    "--protocol",
    type=click.Choice(["grpc", "http"]),
    default="grpc",
    show_default=True,
    help="How the preprocessing server calls the inference servers.",
)
def up(spec_dir: Path, **options: Any) -> None:
    """Start a serving topology for SPEC_DIR as local processes; Ctrl-C stops them all."""
    from pipeserve.launch import Topology, run_topology
    from pipeserve.pipeline.loader import load_spec

    try:
        load_spec(spec_dir)  # a bad spec fails here, once, not in every process
    except SpecError as exc:
        raise SpecInvalid(str(exc)) from exc
    code = run_topology(Topology(spec_dir=spec_dir.resolve(), **options))
    raise SystemExit(code)


@contextlib.contextmanager
def _metrics_shared_by_workers(workers: int) -> Iterator[None]:
    """With several workers, give them one PROMETHEUS_MULTIPROC_DIR so /metrics adds up all of them."""
    if workers == 1 or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        yield
        return
    directory = tempfile.mkdtemp(prefix="pipeserve-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    try:
        yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@cli.command()
@SPEC_DIR
@click.option(
    "--redis", "redis_url", default=None, help="The job queue: redis://HOST:6379/0 [env PIPESERVE_REDIS_URL]."
)
@click.option("--concurrency", type=click.IntRange(1, 4096), default=None, help="Jobs at once [2x the largest batch].")
@click.option("--max-attempts", type=click.IntRange(1, 100), default=None, help="Runs before the dead letters [3].")
@click.option("--visibility-timeout", type=float, default=None, help="Seconds before a silent worker's jobs move [60].")
@click.option("--name", default=None, help="This worker's consumer name [host-pid].")
@click.option("--log-level", default=None, help="critical|error|warning|info|debug [env LOGLEVEL; default info].")
@click.option("--log-format", type=click.Choice(["json", "text"]), default=None, help="Log line format [json].")
def worker(spec_dir: Path, **options: Any) -> None:
    """Run jobs submitted to POST /jobs (by `pipeserve serve SPEC_DIR --redis URL`) from the Redis queue.

    Start any number, on any number of machines; each takes jobs of the release it was built from.
    """
    from pipeserve.config import JobSettings, WorkerSettings

    job_options = {
        "concurrency": options.pop("concurrency"),
        "max_attempts": options.pop("max_attempts"),
        "visibility_timeout_s": options.pop("visibility_timeout"),
    }
    if options.get("redis_url") is None and not os.environ.get("PIPESERVE_REDIS_URL"):
        raise click.UsageError("a worker needs the queue: --redis redis://HOST:6379/0 (or PIPESERVE_REDIS_URL)")
    jobs = _settings(JobSettings, **job_options)
    settings = _settings(WorkerSettings, spec_dir=spec_dir, jobs=jobs, **options)
    from pipeserve.app import run_worker

    try:
        code = run_worker(settings)
    except SpecError as exc:
        raise SpecInvalid(str(exc)) from exc
    raise SystemExit(code)


@cli.command()
@SPEC_DIR
@click.option(
    "--input",
    "input_path",
    required=True,
    type=click.Path(exists=True, path_type=Path),
    help="A folder of images, or a .csv, .jsonl or .parquet file.",
)
@click.option("--output", required=True, type=click.Path(path_type=Path), help="Results, one JSON line per record.")
@click.option("--errors", type=click.Path(path_type=Path), default=None, help="Failed records [OUTPUT.errors.jsonl].")
@click.option("--workers", type=click.IntRange(1, 256), default=None, help="Scoring processes [one per core].")
@click.option("--chunk-size", type=click.IntRange(1, 100_000), default=32, show_default=True)
@click.option("--endpoint", default="predict", show_default=True, help="predict, label, or an endpoint of the spec.")
@click.option("--param", "params", multiple=True, help="A step parameter, as a query would pass it: k=5.")
@click.option("--columns", default=None, help="Tables: the comma-separated columns of a tensor row [all].")
@click.option("--id-column", default=None, help="Tables and JSONL: the column or field that keys a record [row].")
@click.option("--image-column", default=None, help="Tables, image pipelines: the column of image file paths.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--ray-address", default=None, help="A Ray cluster (ray://HOST:10001 or auto) [a local Ray].")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def batch(spec_dir: Path, input_path: Path, output: Path, **options: Any) -> None:
    """Score a folder of images or a CSV, JSONL or Parquet file with SPEC_DIR's pipeline, offline.

    Resumable: a rerun of the same command skips every record already in the output or the errors file.
    """
    from pipeserve.observability.logging import configure_logging
    from pipeserve.offline.io import InputOptions
    from pipeserve.offline.scorer import ScoreOptions, ScoringFailed, score

    configure_logging("warning", "text")
    params = {}
    for item in options["params"]:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--param")
        params[name] = value
    endpoint = options["endpoint"]
    columns = tuple(c.strip() for c in options["columns"].split(",") if c.strip()) if options["columns"] else None
    try:
        report = score(
            ScoreOptions(
                spec_dir=spec_dir,
                input=input_path,
                output=output,
                errors=options["errors"],
                workers=options["workers"],
                chunk_size=options["chunk_size"],
                endpoint="predict" if endpoint == "label" else endpoint,
                label=endpoint == "label",
                params=params,
                input_options=InputOptions(columns, options["id_column"], options["image_column"]),
                progress=not options["no_progress"],
                engine=options["engine"],
                ray_address=options["ray_address"],
            )
        )
    except SpecError as exc:
        raise SpecInvalid(str(exc)) from exc
    except ScoringFailed as exc:
        raise CheckFailed(str(exc)) from exc
    if options["as_json"]:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(
            f"scored {report.scored} records ({report.failed} failed, {report.skipped} already done) in "
            f"{report.seconds:.1f}s ({report.startup_s:.1f}s loading): {report.records_per_s:.1f} records/s\n"
            f"results: {report.output}\nerrors:  {report.errors}"
        )


@cli.command()
@SPEC_DIR
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check(spec_dir: Path, as_json: bool) -> None:
    """Validate SPEC_DIR, load its models, warm up and run the golden check, without serving."""
    from pipeserve.app import check_pipeline
    from pipeserve.observability.logging import configure_logging

    configure_logging("warning", "text")  # warnings (unreachable nodes) and errors go to stderr once
    try:
        report = asyncio.run(check_pipeline(spec_dir))
    except SpecError as exc:
        raise SpecInvalid(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            if key != "warnings":
                click.echo(f"{key:>12}: {value}")
    if not report["ready"]:
        raise CheckFailed(f"pipeline is not ready: {report['reason']}")


def main() -> None:
    """Entry point of the ``pipeserve`` script."""
    cli(prog_name="pipeserve")


if __name__ == "__main__":  # pragma: no cover
    main()
