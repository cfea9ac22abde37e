"""Shared fixtures. Tier markers come from the folder a test lives in (unit / integration / e2e)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
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
    if not (directory / artifact).is_file():  # `make test` builds them first; a bare `pytest` builds here
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
