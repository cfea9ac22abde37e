"""Static checks of deploy/queue/docker-compose.yml (Redis, an API server, workers), without a Docker engine:
the file is parsed and checked against the repository, the CLI it calls and the settings the processes read."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from pipeserve.config import ServerSettings, WorkerSettings
from tests.unit.test_deploy_files import (
    ROOT,
    assert_builds_deploy_dockerfile,
    assert_options_exist,
    assert_probes_readiness_with_python,
    command,
    compose,
    environment,
    option,
    published_ports,
    service,
)

COMPOSE = ROOT / "deploy" / "queue" / "docker-compose.yml"
SPEC_DIR = "examples/imagenet"


def redis_url(name: str) -> str:
    url = option(command(name, COMPOSE), "--redis") or environment(name, COMPOSE).get("PIPESERVE_REDIS_URL")
    assert url, f"{name} has no --redis (nor PIPESERVE_REDIS_URL): it would not use the shared queue"
    return url


def test_the_file_defines_redis_an_api_and_workers() -> None:
    assert set(compose(COMPOSE)["services"]) == {"redis", "api", "worker"}
    assert service("worker", COMPOSE)["deploy"]["replicas"] >= 2


@pytest.mark.parametrize("name", ["api", "worker"])
def test_pipeserve_services_build_one_image_and_run_the_example(name: str) -> None:
    assert_builds_deploy_dockerfile(name, COMPOSE)
    assert service(name, COMPOSE)["image"] == service("api", COMPOSE)["image"], "one image: one release"
    words = command(name, COMPOSE)
    assert words[:3] == ["pipeserve", "serve" if name == "api" else "worker", SPEC_DIR]
    assert (ROOT / SPEC_DIR / "pipeline.yaml").is_file()
    assert_options_exist(words)


@pytest.mark.parametrize("name", ["api", "worker"])
def test_both_reach_the_redis_service_and_wait_for_it(name: str) -> None:
    parts = urlsplit(redis_url(name))
    assert (parts.scheme, parts.hostname, parts.port or 6379) == ("redis", "redis", 6379)
    assert service(name, COMPOSE)["depends_on"]["redis"]["condition"] == "service_healthy"


def test_the_settings_read_the_environment_the_file_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in environment("worker", COMPOSE).items():
        monkeypatch.setenv(key, value)
    assert WorkerSettings().redis_url == "redis://redis:6379/0"  # read from the environment
    assert ServerSettings(redis_url=redis_url("api")).redis_url == redis_url("worker")


def test_the_api_listens_everywhere_is_published_and_probed() -> None:
    assert option(command("api", COMPOSE), "--host") == "0.0.0.0"
    assert published_ports("api", COMPOSE) == {8000: 8000}
    assert_probes_readiness_with_python("api", "http://127.0.0.1:8000/health/ready", COMPOSE)


def test_redis_is_health_checked_and_keeps_its_data() -> None:
    redis = service("redis", COMPOSE)
    assert redis["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]
    assert "--appendonly" in redis["command"]
    assert any(str(volume).endswith(":/data") for volume in redis["volumes"])
