"""YAML file -> validated spec, with errors that name the file, the node and the field."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipeserve.errors import SpecError
from pipeserve.pipeline.graph import ExecutionPlan, Graph, build_graph
from pipeserve.pipeline.spec import PipelineSpec, SpecFile

logger = logging.getLogger(__name__)

SPEC_FILENAMES = ("pipeline.yaml", "pipeline.yml")


@dataclass(frozen=True, slots=True)
class LoadedSpec:
    """A parsed and checked spec, with where it came from."""

    path: Path
    spec: PipelineSpec
    plan: ExecutionPlan
    graph: Graph
    labels: tuple[str, ...] | None
    warnings: tuple[str, ...] = field(default=())

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def resolve(self, relative: str) -> Path:
        """A path named in the spec, relative to the spec's folder."""
        return (self.base_dir / relative).resolve()


def find_spec_file(path: str | Path) -> Path:
    """``path`` itself if it is a file, else ``pipeline.yaml`` inside it."""
    p = Path(path).expanduser()
    if p.is_file():
        return p.resolve()
    if p.is_dir():
        for name in SPEC_FILENAMES:
            if (p / name).is_file():
                return (p / name).resolve()
        raise SpecError(f"no {' or '.join(SPEC_FILENAMES)} in {p}", file=p)
    raise SpecError("no such file or directory", file=p)


def load_spec(path: str | Path) -> LoadedSpec:
    """Read, validate and plan a pipeline spec (no models are loaded).

    Raises:
        SpecError: the file is not valid YAML, does not match the format, names unknown nodes, has a cycle,
            or points at files that do not exist. The message names the file, node and field.

    Example:
        >>> loaded = load_spec("examples/seed")  # doctest: +SKIP
        >>> loaded.plan.order                    # doctest: +SKIP
        ('m1', 'm3')
    """
    file = find_spec_file(path)
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {exc}", file=file) from exc
    except OSError as exc:
        raise SpecError(f"cannot read: {exc}", file=file) from exc
    try:
        parsed = SpecFile.model_validate(raw)
    except ValidationError as exc:
        raise _spec_error(exc, raw, file) from exc
    spec = parsed.pipeline
    graph = build_graph(spec.nodes, spec.start_node_name, output=spec.output, endpoints=spec.endpoints, file=str(file))
    plan = ExecutionPlan(order=graph.plans["predict"], unreachable=graph.unreachable)
    start = spec.start_node_name or spec.nodes[0].name
    warnings = [
        f"{file}: node {name!r} is unreachable from start node {start!r} (no endpoint needs it); it will never run"
        for name in plan.unreachable
    ]
    for message in warnings:
        logger.warning(message)
    loaded = LoadedSpec(path=file, spec=spec, plan=plan, graph=graph, labels=None, warnings=tuple(warnings))
    _check_files(loaded)
    return LoadedSpec(path=file, spec=spec, plan=plan, graph=graph, labels=_labels(loaded), warnings=tuple(warnings))


def _spec_error(exc: ValidationError, raw: Any, file: Path) -> SpecError:
    problems: list[tuple[str | None, str | None, str]] = []
    for err in exc.errors():
        loc = list(err["loc"])
        node = None
        if len(loc) >= 3 and loc[:2] == ["pipeline", "nodes"] and isinstance(loc[2], int):
            node = _node_name(raw, loc[2])
            loc = loc[3:]
        elif loc[:1] == ["pipeline"]:
            loc = loc[1:]
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; docs/spec.md lists the fields)"
        problems.append((node, ".".join(str(p) for p in loc) or None, message))
    if len(problems) == 1:
        node, field_name, message = problems[0]
        return SpecError(message, file=file, node=node, field=field_name)
    return SpecError("; ".join(str(SpecError(m, node=n, field=f)) for n, f, m in problems), file=file)


def _node_name(raw: Any, index: int) -> str:
    try:
        name = raw["pipeline"]["nodes"][index].get("name")
    except (KeyError, IndexError, TypeError, AttributeError):
        name = None
    return str(name) if name else f"#{index + 1}"


def _check_files(loaded: LoadedSpec) -> None:
    spec = loaded.spec
    for node in spec.nodes:
        meta = node.model_load_meta
        if meta is not None and meta.artifact is not None and not loaded.resolve(meta.artifact).exists():
            raise SpecError(
                f"missing artifact {loaded.resolve(meta.artifact)} (build it first, e.g. `make examples`)",
                file=loaded.path,
                node=node.name,
                field="model_load_meta.artifact",
            )
    if isinstance(spec.labels, str) and not loaded.resolve(spec.labels).is_file():
        raise SpecError(f"missing labels file {loaded.resolve(spec.labels)}", file=loaded.path, field="labels")
    if spec.sample is not None and spec.sample.file is not None and not loaded.resolve(spec.sample.file).is_file():
        raise SpecError(
            f"missing sample file {loaded.resolve(spec.sample.file)}", file=loaded.path, field="sample.file"
        )
    golden = spec.golden
    if (
        golden is not None
        and golden.prediction_file is not None
        and not loaded.resolve(golden.prediction_file).is_file()
    ):
        raise SpecError(
            f"missing golden file {loaded.resolve(golden.prediction_file)}",
            file=loaded.path,
            field="golden.prediction_file",
        )


def _labels(loaded: LoadedSpec) -> tuple[str, ...] | None:
    labels = loaded.spec.labels
    if labels is None:
        return None
    if isinstance(labels, list):
        return tuple(labels)
    lines = loaded.resolve(labels).read_text(encoding="utf-8").splitlines()
    return tuple(line.strip() for line in lines if line.strip())
