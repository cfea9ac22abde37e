"""Static checks of deploy/microservices/docker-compose.yml, the iris_ensemble example's microservices in containers.

As in test_deploy_files.py (whose helpers these reuse), no Docker engine is needed: the file is parsed and checked
against the repository, the CLI it calls (``--help``), the spec (which nodes are remote, on which ports) and the
topology ``pipeserve up --pattern microservices`` starts locally.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pipeserve.config import ServerSettings
from pipeserve.launch import Topology
from pipeserve.pipeline.loader import load_spec
from tests.unit.test_deploy_files import (
    ROOT,
    assert_builds_deploy_dockerfile,
    assert_options_exist,
    assert_probes_readiness_with_python,
    command,
    compose,
    environment,
    option,
    port_option,
    published_ports,
    service,
)

COMPOSE = ROOT / "deploy" / "microservices" / "docker-compose.yml"
SPEC_DIR = "examples/iris_ensemble"
GATEWAY = "gateway"
NODE_SERVICES = ("svc", "logreg")
SERVICES = (GATEWAY, *NODE_SERVICES)
GATEWAY_PORT = 8011
NODE_HTTP_PORT = 8012


@pytest.fixture(scope="module")
def remote_nodes(iris_ensemble_dir: Path) -> dict[str, list[str]]:
    """node -> its remote.url, for every node the spec marks remote (the spec is read as the gateway reads it)."""
    assert iris_ensemble_dir == ROOT / SPEC_DIR
    found: dict[str, list[str]] = {}
    for node in load_spec(iris_ensemble_dir).spec.nodes:
        meta = node.model_load_meta
        if meta is not None and meta.remote.url:
            found[node.name] = list(meta.remote.url)
    assert found, f"{SPEC_DIR} marks no node remote: there is nothing to serve apart"
    return found


def remote_option() -> str:
    """The gateway's --remote, or its PIPESERVE_REMOTE."""
    given = option(command(GATEWAY, COMPOSE), "--remote") or environment(GATEWAY, COMPOSE).get("PIPESERVE_REMOTE")
    assert given, "the gateway has no --remote (nor PIPESERVE_REMOTE): it would call 127.0.0.1, its own container"
    return given


def models_served(name: str) -> list[str]:
    models = option(command(name, COMPOSE), "--models")
    assert models, f"{name} serves every model node (no --models): one node per service"
    return [model.strip() for model in models.split(",")]


def test_the_file_parses_into_the_gateway_and_the_node_services() -> None:
    assert compose(COMPOSE).get("name") == "pipeserve-microservices"
    assert set(compose(COMPOSE)["services"]) == set(SERVICES)


def test_the_header_gives_the_command_and_a_request() -> None:
    header = []
    for line in COMPOSE.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    text = "\n".join(header)
    assert f"docker compose -f {COMPOSE.relative_to(ROOT).as_posix()} up" in text
    assert f"localhost:{GATEWAY_PORT}/predict/label" in text
    assert '{"prediction":"setosa"}' in text


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_builds_deploy_dockerfile_from_the_repository_root(name: str) -> None:
    assert_builds_deploy_dockerfile(name, COMPOSE)


def test_every_service_runs_the_same_image() -> None:
    """One image: the gateway and the node services hold the identical release, so fingerprints match."""
    images = {service(name, COMPOSE).get("image") for name in SERVICES}
    assert len(images) == 1, f"services run different images: {images}"
    assert None not in images, "name the image, so every service runs the one that was built"


@pytest.mark.parametrize("name", SERVICES)
def test_every_command_is_a_pipeserve_subcommand_serving_the_example(name: str) -> None:
    argv = command(name, COMPOSE)
    assert argv[:3] == ["pipeserve", "serve" if name == GATEWAY else "serve-infer", SPEC_DIR]
    assert (ROOT / SPEC_DIR / "pipeline.yaml").is_file()
    assert option(argv, "--host") == "0.0.0.0", f"{name} must listen on every interface of its container"
    assert_options_exist(argv)


def test_the_gateway_runs_the_gateway_pattern_on_8011() -> None:
    argv = command(GATEWAY, COMPOSE)
    assert option(argv, "--pattern") == "gateway", "without --pattern gateway every node would run in the gateway"
    assert port_option(GATEWAY, "--port", COMPOSE) == GATEWAY_PORT
    assert option(argv, "--infer") is None, "--infer is the split's, not the gateway's"


@pytest.mark.parametrize("name", NODE_SERVICES)
def test_every_node_service_serves_one_node_on_the_internal_http_port(name: str) -> None:
    assert models_served(name) == [name]
    assert port_option(name, "--http-port", COMPOSE) == NODE_HTTP_PORT


def test_the_remote_option_maps_every_remote_node_to_the_service_serving_it(remote_nodes: dict[str, list[str]]) -> None:
    given = remote_option()
    assert re.fullmatch(r"\s*[\w.-]+=[^;=\s]+(\s*;\s*[\w.-]+=[^;=\s]+)*\s*;?\s*", given), f"--remote {given!r}"
    urls = ServerSettings(remote=given).remote_urls  # parsed as the gateway parses it
    assert set(urls) == set(remote_nodes), f"--remote names {sorted(urls)}, the spec marks {sorted(remote_nodes)}"
    targeted = []
    for node, node_urls in urls.items():
        assert len(node_urls) == len(remote_nodes[node]), f"{node}: one service per URL of the spec"
        for url, spec_url in zip(node_urls, remote_nodes[node], strict=True):
            parts, spec_parts = urlsplit(url), urlsplit(spec_url)
            host = parts.hostname
            assert parts.scheme == spec_parts.scheme == "grpc", f"{node}: {url} (spec: {spec_url}), expected grpc://"
            assert host in NODE_SERVICES, f"{node}: {url} is not a node service of this file"
            assert models_served(host) == [node], f"{node}: {url} reaches {host}, which serves {models_served(host)}"
            grpc_port = port_option(host, "--grpc-port", COMPOSE)
            assert parts.port == grpc_port, f"{node}: {url} is not {host}'s gRPC port {grpc_port}"
            assert parts.port == spec_parts.port, f"{node}: {url} moves the spec's port ({spec_url})"
            targeted.append(host)
    assert sorted(targeted) == sorted(NODE_SERVICES), f"every node service is called once: {targeted}"


def test_the_services_are_what_pipeserve_up_starts_locally(remote_nodes: dict[str, list[str]]) -> None:
    """`pipeserve up --pattern microservices`: the same nodes on the same gRPC ports, the gateway on the same port."""
    *nodes, (_, gateway, _) = Topology(ROOT / SPEC_DIR, pattern="microservices").commands()
    assert len(nodes) == sum(len(urls) for urls in remote_nodes.values())
    expected = sorted(f"{option(argv, '--models')}:{option(argv, '--grpc-port')}" for _, argv, _ in nodes)
    found = sorted(
        f"{option(command(n, COMPOSE), '--models')}:{port_option(n, '--grpc-port', COMPOSE)}" for n in NODE_SERVICES
    )
    assert found == expected, "--models and --grpc-port of the node services"
    for flag in ("--pattern", "--port"):
        assert option(command(GATEWAY, COMPOSE), flag) == option(gateway, flag), f"the gateway's {flag}"


def test_the_gateway_starts_once_every_node_service_is_healthy() -> None:
    depends_on = service(GATEWAY, COMPOSE).get("depends_on")
    assert isinstance(depends_on, dict), "depends_on needs the long form, with conditions"
    remotes = ServerSettings(remote=remote_option()).remote_urls
    hosts = {str(urlsplit(url).hostname) for urls in remotes.values() for url in urls}
    assert hosts <= set(depends_on), f"the gateway does not wait for {sorted(hosts - set(depends_on))}"
    for name in NODE_SERVICES:
        assert depends_on.get(name, {}).get("condition") == "service_healthy", f"the gateway does not wait for {name}"
        assert "healthcheck" in service(name, COMPOSE)


def test_only_the_gateway_port_is_published() -> None:
    for name in NODE_SERVICES:
        assert not service(name, COMPOSE).get("ports"), f"{name} publishes ports: only the gateway's is public"
        assert not service(name, COMPOSE).get("network_mode"), f"{name}: keep it on the compose network"
    assert len(service(GATEWAY, COMPOSE).get("ports", [])) == 1, "the gateway publishes one port"
    assert published_ports(GATEWAY, COMPOSE) == {GATEWAY_PORT: port_option(GATEWAY, "--port", COMPOSE)}


@pytest.mark.parametrize("name", SERVICES)
def test_healthchecks_probe_readiness_with_python(name: str) -> None:
    if name == GATEWAY:
        url = f"http://127.0.0.1:{port_option(name, '--port', COMPOSE)}/health/ready"
    else:
        url = f"http://127.0.0.1:{port_option(name, '--http-port', COMPOSE)}/v2/health/ready"
    assert_probes_readiness_with_python(name, url, COMPOSE)
