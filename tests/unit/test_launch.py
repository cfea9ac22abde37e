"""`pipeserve up`: the commands a topology runs, and a failing process taking the others down."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeserve.cli.main import cli
from pipeserve.launch import Topology, TopologyFailed, _wait_ready


def test_prep_pred_runs_n_inference_servers_then_a_prep_server_calling_all_of_them() -> None:
    topology = Topology(spec_dir=Path("/srv/spec"), infer_replicas=2, prep_workers=3)
    commands = topology.commands()
    assert [name for name, _, _ in commands] == ["infer-1", "infer-2", "prep"]
    infer_1, infer_2, prep = (argv for _, argv, _ in commands)
    assert infer_1[3:] == [
        "serve-infer",
        "/srv/spec",
        "--host",
        "127.0.0.1",
        "--http-port",
        "8012",
        "--grpc-port",
        "50051",
    ]
    assert infer_2[-4:] == ["--http-port", "8013", "--grpc-port", "50052"]
    assert prep[prep.index("--infer") + 1] == "grpc://127.0.0.1:50051,grpc://127.0.0.1:50052"
    assert prep[prep.index("--port") + 1] == "8011"
    assert prep[prep.index("--workers") + 1] == "3"
    assert commands[-1][2] == "http://127.0.0.1:8011/health/ready"
    assert commands[0][2] == "http://127.0.0.1:8012/v2/health/ready"


def test_http_protocol_points_the_prep_server_at_the_http_ports() -> None:
    prep = Topology(spec_dir=Path("/s"), infer_replicas=2, protocol="http").commands()[-1][1]
    assert prep[prep.index("--infer") + 1] == "http://127.0.0.1:8012,http://127.0.0.1:8013"


def test_a_process_that_exits_before_it_is_ready_fails_the_topology(tmp_path: Path) -> None:
    import subprocess

    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    with pytest.raises(TopologyFailed, match="infer-1 exited with status 3 before it was ready"):
        _wait_ready("infer-1", process, "http://127.0.0.1:9/", 5.0, lambda: False)


def test_up_refuses_a_bad_spec_before_starting_anything(tmp_path: Path) -> None:
    (tmp_path / "pipeline.yaml").write_text("pipeline:\n  name: x\n  nodes: []\n")
    result = CliRunner().invoke(cli, ["up", str(tmp_path)])
    assert result.exit_code == 2
    assert "pipeline.yaml" in result.output
