"""A real MLServer (Seldon) serving the iris model, to test Open Inference Protocol (v2) clients against.

MLServer lives in its own venv, bench/peers/mlserver-sklearn/.venv, which `bench/peers/setup.sh` installs on first
use (it is never a project dependency). The `mlserver_iris` fixture serves examples/iris/models/iris.joblib through
MLServer's scikit-learn runtime as model "classifier", version "v1", on free local ports, for the whole session.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, _ensure_built
from tests.e2e.conftest import free_port, stop

PEERS = ROOT / "bench" / "peers"
MLSERVER_PEER = "mlserver-sklearn"
MLSERVER = PEERS / MLSERVER_PEER / ".venv" / "bin" / "mlserver"
MODEL = "classifier"
VERSION = "v1"
SETUP_TIMEOUT_S = 540.0
READY_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class MLServerPeer:
    """A running MLServer. `http_url` is "http://127.0.0.1:PORT"; `grpc_target` is "127.0.0.1:PORT"."""

    http_url: str
    grpc_target: str
    model: str
    version: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""


def install_mlserver() -> Path:
    """Create bench/peers/mlserver-sklearn/.venv if needed (setup.sh skips an up-to-date install); its `mlserver`."""
    result = subprocess.run(
        ["bash", str(PEERS / "setup.sh"), MLSERVER_PEER],
        capture_output=True,
        text=True,
        timeout=SETUP_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0 or not MLSERVER.is_file():
        pytest.fail(
            f"bench/peers/setup.sh {MLSERVER_PEER} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}",
            pytrace=False,
        )
    return MLSERVER


def write_model_repository(root: Path, *, http_port: int, grpc_port: int, metrics_port: int) -> Path:
    """settings.json and classifier/{model-settings.json, model.joblib} under root; returns root."""
    iris = _ensure_built("iris", "models/iris.joblib", "build_iris.py")
    root.mkdir(parents=True, exist_ok=True)
    settings = {
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "parallel_workers": 0,
        "debug": False,
    }
    (root / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    model_dir = root / MODEL
    model_dir.mkdir(parents=True, exist_ok=True)
    model_settings = {
        "name": MODEL,
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./model.joblib", "version": VERSION},
    }
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings, indent=2) + "\n")
    shutil.copyfile(iris / "models" / "iris.joblib", model_dir / "model.joblib")
    return root


def _distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@pytest.fixture(scope="session")
def mlserver_iris(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLServerPeer]:
    """MLServer 1.7.1 serving the iris model as "classifier" v1 (sklearn runtime: outputs predict, predict_proba)."""
    mlserver = install_mlserver()
    root = tmp_path_factory.mktemp("mlserver")
    http_port, grpc_port, metrics_port = _distinct_free_ports(3)
    repository = write_model_repository(
        root / "models", http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port
    )
    peer = MLServerPeer(
        http_url=f"http://127.0.0.1:{http_port}",
        grpc_target=f"127.0.0.1:{grpc_port}",
        model=MODEL,
        version=VERSION,
        log_path=root / "mlserver.log",
    )
    with peer.log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(mlserver), "start", str(repository)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
            start_new_session=True,
        )
    try:
        _wait_ready(peer, process)
        yield peer
    finally:
        stop(process)


def _wait_ready(peer: MLServerPeer, process: subprocess.Popen[bytes]) -> None:
    ready_url = f"{peer.http_url}/v2/models/{peer.model}/ready"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(f"mlserver exited with {process.returncode}:\n{peer.log()}", pytrace=False)
        try:
            if httpx.get(ready_url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"mlserver: {ready_url} not 200 after {READY_TIMEOUT_S:.0f} s:\n{peer.log()}", pytrace=False)
        time.sleep(0.2)
