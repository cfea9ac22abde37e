"""Shared fixtures. Tier markers come from the folder a test lives in (unit / integration / e2e)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT / "tests").parts
        if parts and parts[0] in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, parts[0]))


def _load_build_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_build_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ensure_built(example: str, artifact: str, script: str) -> Path:
    directory = EXAMPLES / example
    built = directory / artifact
    # `make test` builds them first; a bare `pytest` builds here, also when the build script changed since
    if not built.is_file() or built.stat().st_mtime < (directory / script).stat().st_mtime:
        _load_build_module(directory / script).build()
    return directory


@pytest.fixture(scope="session")
def iris_dir() -> Path:
    """examples/iris with its ONNX model built."""
    return _ensure_built("iris", "models/iris.onnx", "build_iris.py")


@pytest.fixture(scope="session")
def imagenet_dir() -> Path:
    """examples/imagenet with its ONNX model, labels, sample and golden output built."""
    return _ensure_built("imagenet", "models/efficientnet_lite0.onnx", "build_imagenet.py")


@pytest.fixture(scope="session")
def iris_ensemble_dir() -> Path:
    """examples/iris_ensemble with its two ONNX models and averaged golden output built."""
    return _ensure_built("iris_ensemble", "models/svc.onnx", "build_iris_ensemble.py")


@pytest.fixture(scope="session")
def seed_dir() -> Path:
    """The seed pipeline of DESIGN.md's appendix, exactly as written, with three dummy handlers."""
    return EXAMPLES / "seed"


@pytest.fixture
def copy_example(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Copy an example folder to tmp_path so a test can edit its spec or files."""

    def copy(source: Path) -> Path:
        target = tmp_path / source.name
        shutil.copytree(source, target)
        return target

    return copy


@pytest.fixture(scope="session")
def cat_jpeg(imagenet_dir: Path) -> bytes:
    return (imagenet_dir / "samples" / "cat.jpg").read_bytes()


def python_executable() -> str:
    return sys.executable


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Redis: the one at 127.0.0.1:6379 when it answers (database 15, keys per test), else a private
    ``redis-server`` started on a free port. No Redis at all is a failure, not a skip."""
    import subprocess
    import time

    import redis

    try:
        redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1).ping()
    except redis.RedisError:
        pass
    else:
        yield "redis://127.0.0.1:6379/15"
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "no Redis answers at 127.0.0.1:6379 and there is no redis-server to start (apt install redis-server)"
        )
    port = _free_port()
    directory = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)
