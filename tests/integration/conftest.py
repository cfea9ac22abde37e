from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from pipeserve.app import build_rest_app
from pipeserve.config import ServerSettings


@pytest.fixture
def client_factory() -> Iterator[Any]:
    """Start the REST app for a spec dir (lifespan included); every client is closed at the end."""
    clients: list[TestClient] = []

    def make(spec_dir: Path, **settings: Any) -> TestClient:
        settings.setdefault("access_log", False)
        app = build_rest_app(ServerSettings(spec_dir=spec_dir, **settings))
        client = TestClient(app, raise_server_exceptions=True)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def iris_client(client_factory: Any, iris_dir: Path) -> TestClient:
    return client_factory(iris_dir)  # type: ignore[no-any-return]
