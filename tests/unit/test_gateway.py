"""Which nodes a gateway calls remotely, and where: the spec's remote.url, or --remote overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeserve.app import gateway_remotes
from pipeserve.config import ServerSettings
from pipeserve.errors import SpecError
from pipeserve.pipeline.loader import load_spec


def pools(urls: list[str]) -> Any:
    return tuple(urls)  # stands in for a RemoteModels: the test only looks at which URLs each node gets


def test_remote_overrides_parse_node_url_lists() -> None:
    settings = ServerSettings(remote="svc=grpc://svc:50061; logreg=grpc://a:1,grpc://b:2")
    assert settings.remote_urls == {"svc": ["grpc://svc:50061"], "logreg": ["grpc://a:1", "grpc://b:2"]}


def test_the_spec_urls_are_used_unless_overridden(iris_ensemble_dir: Path) -> None:
    loaded = load_spec(iris_ensemble_dir)
    found: dict[str, Any] = dict(gateway_remotes(loaded, pools))
    assert found == {"svc": ("grpc://127.0.0.1:50061",), "logreg": ("grpc://127.0.0.1:50062",)}
    moved: dict[str, Any] = dict(gateway_remotes(loaded, pools, {"svc": ["grpc://svc:50061"]}))
    assert moved["svc"] == ("grpc://svc:50061",)
    assert moved["logreg"] == ("grpc://127.0.0.1:50062",)


def test_an_override_for_an_unknown_node_is_refused(iris_ensemble_dir: Path) -> None:
    with pytest.raises(SpecError, match="unknown nodes \\['nope'\\]"):
        gateway_remotes(load_spec(iris_ensemble_dir), pools, {"nope": ["grpc://x:1"]})


def test_a_gateway_needs_some_remote_node(iris_dir: Path) -> None:
    with pytest.raises(SpecError, match="no node is marked remote"):
        gateway_remotes(load_spec(iris_dir), pools)
