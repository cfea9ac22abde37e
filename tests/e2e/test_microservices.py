"""Nodes anywhere: the same spec in one process and as microservices (a gateway + a service per remote node)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import free_port, run_server, run_up

pytestmark = pytest.mark.e2e

ROWS = {"data": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]]}


def test_the_same_pipeline_gives_identical_outputs_in_process_and_as_microservices(
    iris_ensemble_dir: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "ensemble"
    shutil.copytree(iris_ensemble_dir, spec)
    svc_port, logreg_port, average_port, gateway_port = free_port(), free_port(), free_port(), free_port()
    text = (spec / "pipeline.yaml").read_text()
    text = text.replace("grpc://127.0.0.1:50061", f"grpc://127.0.0.1:{svc_port}")
    text = text.replace("grpc://127.0.0.1:50062", f"grpc://127.0.0.1:{logreg_port}")
    # the combining handler too: any node can live elsewhere (its values travel as v2 tensors)
    text = text.replace(
        "model_load_meta: {handler_module: 'combine:Average'}",
        f"model_load_meta: {{handler_module: 'combine:Average', remote: {{url: 'grpc://127.0.0.1:{average_port}'}}}}",
    )
    assert str(average_port) in text
    (spec / "pipeline.yaml").write_text(text)

    with run_server(["serve", str(spec)], tmp_path=tmp_path) as single:
        expected = {
            path: httpx.post(f"{single.url}{path}", json=ROWS).json() for path in ("/predict", "/predict/label")
        }
        assert httpx.get(f"{single.url}/metadata").json()["inference"] == "in-process"

    log_path = tmp_path / "up.log"
    with run_up([str(spec), "--pattern", "microservices", "--prep-port", str(gateway_port)], log_path=log_path):
        gateway = f"http://127.0.0.1:{gateway_port}"
        got = {path: httpx.post(f"{gateway}{path}", json=ROWS).json() for path in ("/predict", "/predict/label")}
        remote = httpx.get(f"{gateway}/metadata").json()["inference"]["nodes"]
        log = log_path.read_text()
    assert got == expected  # bit for bit: the same models, the same combine step, only the place differs
    assert expected["/predict/label"]["prediction"] == ["setosa", "virginica", "versicolor"]
    assert remote["svc"]["endpoints"] == [{"url": f"grpc://127.0.0.1:{svc_port}", "up": True, "reason": None}]
    assert remote["logreg"]["endpoints"][0]["url"] == f"grpc://127.0.0.1:{logreg_port}"
    assert "serve-infer" in log
    assert "--models svc" in log
    assert "--models average" in log
    assert remote["average"]["endpoints"][0]["url"] == f"grpc://127.0.0.1:{average_port}"
    assert "--pattern gateway" in log
