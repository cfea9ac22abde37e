"""Static checks of the deployment files: deploy/Dockerfile, deploy/prep-pred/docker-compose.yml, .dockerignore.

No Docker engine is needed (and no hadolint): the files are parsed here and checked against the repository and
against the CLI they call, whose options are read from ``python -m pipeserve.cli.main <subcommand> --help``.
The compose helpers take the file (prep-pred's by default): test_deploy_microservices.py reuses them.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
COMPOSE = ROOT / "deploy" / "prep-pred" / "docker-compose.yml"
DOCKERIGNORE = ROOT / ".dockerignore"

BASE_IMAGE = "python:3.11-slim"
SPEC_DIR = "examples/imagenet"
BUILD_SCRIPT = "examples/imagenet/build_imagenet.py"
# every example the image holds: spec folder -> the script that builds its artifacts
EXAMPLES = {SPEC_DIR: BUILD_SCRIPT, "examples/iris_ensemble": "examples/iris_ensemble/build_iris_ensemble.py"}
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PREP = "prep"
INFER = ("infer-1", "infer-2")
SUBCOMMAND = {PREP: "serve", "infer-1": "serve-infer", "infer-2": "serve-infer"}
# published port -> (service, the option of its command that sets the container port)
PUBLISHED = {8011: (PREP, "--port"), 8012: ("infer-1", "--http-port"), 50051: ("infer-1", "--grpc-port")}
# service -> (readiness path, the option that sets the port it is served on)
READINESS = {PREP: ("/health/ready", "--port"), **dict.fromkeys(INFER, ("/v2/health/ready", "--http-port"))}


# --- the Dockerfile ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    arguments: str


@functools.cache
def dockerfile() -> tuple[Instruction, ...]:
    """The instructions, continuation lines joined, comments and parser directives dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        lines.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends in a line continuation"
    instructions: list[Instruction] = []
    stage = -1
    for line in lines:
        keyword, _, arguments = line.partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        assert stage >= 0, f"an instruction before the first FROM: {line}"
        instructions.append(Instruction(stage, keyword.upper(), arguments.strip()))
    return tuple(instructions)


def instructions(keyword: str, stage: int | None = None) -> list[Instruction]:
    return [i for i in dockerfile() if i.keyword == keyword and (stage is None or i.stage == stage)]


def final_stage() -> int:
    return dockerfile()[-1].stage


def words(arguments: str) -> list[str]:
    """An instruction's arguments, in exec (JSON) form or shell form."""
    if arguments.startswith("["):
        parsed = json.loads(arguments)
        assert isinstance(parsed, list), arguments
        return [str(word) for word in parsed]
    return shlex.split(arguments)


def split_flags(arguments: str) -> tuple[dict[str, str], str]:
    """``--from=build --chown=1:1 a b`` -> ({"from": "build", "chown": "1:1"}, "a b")."""
    flags: dict[str, str] = {}
    rest = arguments
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        rest = rest.lstrip()
    return flags, rest


def stage_names() -> dict[str, int]:
    names: dict[str, int] = {}
    for instruction in instructions("FROM"):
        parts = instruction.arguments.split()
        if len(parts) == 3 and parts[1].upper() == "AS":
            names[parts[2]] = instruction.stage
    return names


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip().strip("/") for line in lines if line.strip() and not line.strip().startswith("#")]


def is_dockerignored(path: str) -> bool:
    """Whether .dockerignore drops ``path`` or a folder it is in (exclusions only; ``!`` re-inclusions count)."""
    parts = PurePosixPath(path.strip("/")).parts
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for pattern in dockerignore_patterns():
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!")
        if any(fnmatch(candidate, glob) or fnmatch(candidate, glob.removeprefix("**/")) for candidate in candidates):
            ignored = not negated
    return ignored


def test_every_stage_is_based_on_python_311_slim() -> None:
    names = stage_names()
    bases = [instruction.arguments.split()[0] for instruction in instructions("FROM")]
    assert bases, "no FROM"
    for base in bases:
        assert base in names or base == BASE_IMAGE, f"FROM {base}: expected {BASE_IMAGE} or an earlier stage"


def test_copy_sources_exist_in_the_repository_and_are_not_dockerignored() -> None:
    copies = instructions("COPY") + instructions("ADD")
    assert copies, "the Dockerfile copies nothing"
    for instruction in copies:
        flags, rest = split_flags(instruction.arguments)
        sources = words(rest)[:-1]
        assert sources, f"COPY without a source: {instruction.arguments}"
        if "from" in flags:
            assert flags["from"] in stage_names(), f"COPY --from={flags['from']}: no such stage"
            assert stage_names()[flags["from"]] < instruction.stage, f"COPY --from a later stage: {flags['from']}"
            continue
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not is_dockerignored(source), f"COPY {source}: excluded by .dockerignore"


def test_the_final_stage_runs_as_a_non_root_user() -> None:
    users = instructions("USER", final_stage())
    assert users, "the final stage has no USER: it would run as root"
    user = users[-1].arguments.split(":")[0]
    assert user not in ("root", "0"), f"USER {users[-1].arguments}"


def test_torch_2_13_0_is_installed_explicitly_from_the_cpu_index_before_the_project() -> None:
    runs = [instruction.arguments for instruction in instructions("RUN")]
    torch = [n for n, run in enumerate(runs) if re.search(r"pip install\b.*\btorch==2\.13\.0(\s|$)", run)]
    assert torch, "no RUN pip install torch==2.13.0"
    assert all(f"--index-url {TORCH_CPU_INDEX}" in runs[n] for n in torch), f"torch not from {TORCH_CPU_INDEX}"
    project = [n for n, run in enumerate(runs) if re.search(r"pip install\b.*\s'?\.(\[|\s|'|$)", run)]
    assert project, "the project is never installed (pip install '.[...]')"
    assert min(torch) < min(project), "torch must be installed before the project, or pip pulls a CUDA build"
    for run in runs:
        for spec in re.findall(r"\btorch[^\s']*", run):
            assert spec == "torch==2.13.0", f"another torch spec: {spec} in RUN {run}"


def test_the_extras_installed_exist_in_pyproject() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    defined = set(pyproject["project"]["optional-dependencies"])
    used = {
        extra.strip()
        for instruction in instructions("RUN")
        for group in re.findall(r"\.\[([^\]]*)\]", instruction.arguments)
        for extra in group.split(",")
    }
    assert used, "no pip install '.[extras]'"
    assert used <= defined, f"extras not in pyproject.toml: {sorted(used - defined)}"


def workdir(stage: int) -> PurePosixPath:
    """The WORKDIR a stage ends with (inherited from the stage it is FROM, if any)."""
    path = PurePosixPath("/")
    base = instructions("FROM", stage)[0].arguments.split()[0]
    if base in stage_names():
        path = workdir(stage_names()[base])
    for instruction in instructions("WORKDIR", stage):
        path = path / instruction.arguments  # an absolute WORKDIR replaces the path
    return path


def copies(instruction: Instruction, folder: PurePosixPath) -> bool:
    """Whether a COPY or ADD brings ``folder`` (absolute: in the context, or in the ``--from`` stage): one of its
    sources is that folder or a folder it is in."""
    sources = words(split_flags(instruction.arguments)[1])[:-1]
    return instruction.keyword in ("COPY", "ADD") and any(folder.is_relative_to(PurePosixPath("/", s)) for s in sources)


@pytest.mark.parametrize(("spec_dir", "build_script"), EXAMPLES.items())
def test_the_image_builds_and_checks_each_example_release(spec_dir: str, build_script: str) -> None:
    """Copied into a stage, built there, checked there, and the built folder copied into the final stage."""
    assert (ROOT / build_script).is_file()
    assert (ROOT / spec_dir / "pipeline.yaml").is_file()
    program = dockerfile()
    built = [n for n, i in enumerate(program) if i.keyword == "RUN" and f"python {build_script}" in i.arguments]
    assert built, f"{spec_dir}: the example's artifacts are not built in the image"
    at, stage = built[0], program[built[0]].stage
    context_copies = [i for i in program[:at] if i.stage == stage and "from" not in split_flags(i.arguments)[0]]
    assert any(copies(i, PurePosixPath("/", spec_dir)) for i in context_copies), f"{spec_dir} is not copied first"
    check = re.compile(rf"\bpipeserve check {re.escape(spec_dir)}/?(?![\w/.-])")
    checks = [i for i in program[at:] if i.stage == stage and i.keyword == "RUN" and check.search(i.arguments)]
    assert checks, f"the built {spec_dir} is not checked against its golden output (pipeserve check)"
    final = final_stage()
    assert stage != final, "build in an earlier stage: the build-only extras stay out of the final image"
    names = {name for name, index in stage_names().items() if index == stage} | {str(stage)}
    delivered = [i for i in instructions("COPY", final) if split_flags(i.arguments)[0].get("from") in names]
    built_folder = workdir(stage) / spec_dir
    assert any(copies(i, built_folder) for i in delivered), f"the final stage does not get {built_folder}"


def test_exposes_the_three_ports_and_leaves_health_to_compose() -> None:
    exposed = {int(port.split("/")[0]) for i in instructions("EXPOSE") for port in i.arguments.split()}
    assert exposed == set(PUBLISHED), f"EXPOSE {sorted(exposed)}, expected {sorted(PUBLISHED)}"
    assert not instructions("HEALTHCHECK"), "health is checked by compose, not by the image"


def test_the_default_cmd_serves_the_inference_server() -> None:
    assert not instructions("ENTRYPOINT"), "commands start with `pipeserve`: no ENTRYPOINT expected"
    cmds = instructions("CMD", final_stage())
    assert cmds, "no CMD in the final stage"
    assert cmds[-1].arguments.startswith("["), "CMD in exec form, so the server gets the signals"
    command = words(cmds[-1].arguments)
    assert command[:3] == ["pipeserve", "serve-infer", SPEC_DIR]
    assert option(command, "--host") == "0.0.0.0"
    assert option(command, "--http-port") == "8012"
    assert option(command, "--grpc-port") == "50051"
    assert_options_exist(command)


# --- the compose file -------------------------------------------------------------------------------------------


@functools.cache
def compose(path: Path = COMPOSE) -> dict[str, Any]:
    parsed = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(parsed, dict), f"{path}: not a mapping"
    assert isinstance(parsed.get("services"), dict), f"{path}: no services"
    return parsed


def service(name: str, path: Path = COMPOSE) -> dict[str, Any]:
    services = compose(path)["services"]
    assert name in services, f"no service {name}"
    definition = services[name]
    assert isinstance(definition, dict)
    return definition


def command(name: str, path: Path = COMPOSE) -> list[str]:
    given = service(name, path).get("command")
    assert given, f"{name} has no command"
    return shlex.split(given) if isinstance(given, str) else [str(word) for word in given]


def environment(name: str, path: Path = COMPOSE) -> dict[str, str]:
    """A service's environment, from the mapping or the list (``KEY=VALUE``) form."""
    given = service(name, path).get("environment") or {}
    if isinstance(given, dict):
        return {str(key): str(value) for key, value in given.items()}
    return dict(str(entry).partition("=")[::2] for entry in given)


def option(argv: list[str], name: str) -> str | None:
    """The value of ``--name value`` or ``--name=value`` in a command, or None."""
    for n, word in enumerate(argv):
        if word == name:
            return argv[n + 1] if n + 1 < len(argv) else ""
        if word.startswith(f"{name}="):
            return word.partition("=")[2]
    return None


def port_option(name: str, flag: str, path: Path = COMPOSE) -> int:
    value = option(command(name, path), flag)
    assert value is not None, f"{name}: no {flag} in its command"
    return int(value)


@functools.cache
def cli_help(subcommand: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "pipeserve.cli.main", subcommand, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, f"pipeserve {subcommand} --help failed:\n{result.stderr}"
    return result.stdout


def assert_options_exist(argv: list[str]) -> None:
    assert argv[0] == "pipeserve", f"not a pipeserve command: {argv}"
    assert argv[1] in ("serve", "serve-infer", "worker"), f"not a serving subcommand: {argv[1]}"
    text = cli_help(argv[1])
    for word in argv[2:]:
        if word.startswith("--"):
            name = word.partition("=")[0]
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"pipeserve {argv[1]}: no {name}"


def published_ports(name: str, path: Path = COMPOSE) -> dict[int, int]:
    """published port -> container port, from the short (``"8011:8011"``) or long syntax."""
    ports: dict[int, int] = {}
    for entry in service(name, path).get("ports", []):
        if isinstance(entry, dict):
            if entry.get("published") is not None:
                ports[int(entry["published"])] = int(entry["target"])
            continue
        parts = str(entry).split("/")[0].split(":")
        if len(parts) > 1:
            ports[int(parts[-2])] = int(parts[-1])
    return ports


def test_the_compose_file_defines_the_split() -> None:
    assert set(compose()["services"]) == {PREP, *INFER}


def assert_builds_deploy_dockerfile(name: str, path: Path = COMPOSE) -> None:
    build = service(name, path).get("build")
    assert isinstance(build, dict), f"{name}: build must name the context and the Dockerfile"
    context = (path.parent / build["context"]).resolve()
    assert context == ROOT, f"{name}: build context {context}, expected the repository root"
    assert (context / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE
    assert DOCKERFILE.is_file()


def assert_probes_readiness_with_python(name: str, url: str, path: Path = COMPOSE) -> None:
    healthcheck = service(name, path).get("healthcheck")
    assert isinstance(healthcheck, dict), f"{name} has no healthcheck"
    test = healthcheck["test"]
    assert isinstance(test, list), "healthcheck test in exec form"
    assert test[:3] == ["CMD", "python", "-c"], "slim images have no curl: probe with python -c"
    code = test[3]
    compile(code, f"<{name} healthcheck>", "exec")
    assert f"'{url}'" in code or f'"{url}"' in code, f"{name}: the healthcheck does not probe {url}"
    assert "urllib" in code


@pytest.mark.parametrize("name", [PREP, *INFER])
def test_every_service_builds_deploy_dockerfile_from_the_repository_root(name: str) -> None:
    assert_builds_deploy_dockerfile(name)


def test_every_service_runs_the_same_image() -> None:
    """One image: the preprocessing and inference servers hold the identical release, so fingerprints match."""
    images = {service(name).get("image") for name in [PREP, *INFER]}
    assert len(images) == 1, f"services run different images: {images}"
    assert None not in images, "name the image, so every service runs the one that was built"


@pytest.mark.parametrize("name", [PREP, *INFER])
def test_every_command_is_a_pipeserve_subcommand_serving_the_example(name: str) -> None:
    words = command(name)
    assert words[:3] == ["pipeserve", SUBCOMMAND[name], SPEC_DIR]
    assert (ROOT / SPEC_DIR / "pipeline.yaml").is_file()
    assert option(words, "--host") == "0.0.0.0", f"{name} must listen on every interface of its container"


@pytest.mark.parametrize("name", [PREP, *INFER])
def test_every_option_of_a_command_is_in_the_cli_help(name: str) -> None:
    assert_options_exist(command(name))


def test_every_infer_url_points_at_an_inference_service_and_its_grpc_port() -> None:
    urls = option(command(PREP), "--infer") or environment(PREP).get("PIPESERVE_INFER")
    assert urls, "prep has no --infer (nor PIPESERVE_INFER)"
    hosts = []
    for url in urls.split(","):
        parts = urlsplit(url.strip())
        assert parts.scheme == "grpc", f"{url}: expected grpc://"
        assert parts.hostname in INFER, f"{url}: not an inference service of this file"
        assert parts.port == port_option(parts.hostname, "--grpc-port"), f"{url}: not {parts.hostname}'s gRPC port"
        hosts.append(parts.hostname)
    assert sorted(hosts) == sorted(INFER), f"prep should call every inference replica once: {hosts}"


def test_published_ports_reach_prep_and_the_first_inference_replica() -> None:
    published = {port: (name, target) for name in [PREP, *INFER] for port, target in published_ports(name).items()}
    assert set(published) == set(PUBLISHED)
    for port, (name, flag) in PUBLISHED.items():
        assert published[port] == (name, port_option(name, flag)), f"port {port}"


def test_prep_starts_once_every_inference_server_is_healthy() -> None:
    depends_on = service(PREP).get("depends_on")
    assert isinstance(depends_on, dict), "depends_on needs the long form, with conditions"
    for name in INFER:
        assert depends_on.get(name, {}).get("condition") == "service_healthy", f"prep does not wait for {name}"
        assert "healthcheck" in service(name)


@pytest.mark.parametrize("name", [PREP, *INFER])
def test_healthchecks_probe_readiness_with_python(name: str) -> None:
    path, flag = READINESS[name]
    assert_probes_readiness_with_python(name, f"http://127.0.0.1:{port_option(name, flag)}{path}")


# --- .dockerignore ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [".git", ".venv", "bench/peers/mlserver/.venv", "pipeserve/__pycache__"])
def test_dockerignore_keeps_environments_and_caches_out_of_the_context(path: str) -> None:
    assert is_dockerignored(path)
    assert "bench/peers/*/.venv" in dockerignore_patterns()
