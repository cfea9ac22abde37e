"""Micro-batching through the REST app with fake models: answers, failures, overload, deadlines, flushes."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest


def write_spec(tmp_path: Path, runtime: str, *, batching: str, options: str = "{}") -> Path:
    (tmp_path / "weights.bin").write_bytes(b"\0")
    (tmp_path / "pipeline.yaml").write_text(f"""
pipeline:
  name: batched
  input: {{kind: tensor, shape: [-1, 3]}}
  nodes:
  - name: model
    model_load_meta:
      runtime: tests.fakes:{runtime}
      artifact: weights.bin
      options: {options}
    batching: {batching}
""")
    return tmp_path


def model_of(client: Any) -> Any:
    return client.app.service.pipeline.nodes["model"].runtime


def test_concurrent_callers_get_the_answers_unbatched_execution_gives(client_factory: Any, tmp_path: Path) -> None:
    client = client_factory(write_spec(tmp_path, "SumRuntime", batching="{max_batch_size: 16, max_latency_ms: 20}"))
    rng = random.Random(7)
    rows = [[rng.uniform(-100, 100) for _ in range(3)] for _ in range(64)]

    def ask(row: list[float]) -> float:
        return float(client.post("/predict", json={"data": [row]}).json()["prediction"][0])

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, rows))
    assert answers == pytest.approx([sum(row) for row in rows], rel=1e-5)
    assert max(model_of(client).batches) > 1, "concurrent requests ran together"
    metrics = client.get("/metrics").text
    assert 'pipeserve_batch_size_count{model="model",pipeline="batched"}' in metrics
    assert "pipeserve_batch_queue_wait_seconds_bucket" in metrics
    assert "pipeserve_batch_run_seconds_bucket" in metrics


def test_a_failing_batch_fails_its_callers_and_no_other(client_factory: Any, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, "FailingRuntime", batching="{max_batch_size: 4, max_latency_ms: 30}", options="{poison: 13}"
    )
    client = client_factory(spec)

    def ask(value: int) -> tuple[int, int]:
        return value, client.post("/predict", json={"data": [[value, 0, 0]]}).status_code

    with ThreadPoolExecutor(8) as pool:
        results = dict(pool.map(ask, [1, 2, 13, 4, 5, 6, 7, 8]))
    assert results[13] == 500
    failed = {value for value, status in results.items() if status == 500}
    poisoned = next(rows for rows in model_of(client).batch_rows if 13.0 in rows)
    assert failed == {int(v) for v in poisoned}, "exactly the poisoned batch's callers fail"
    assert len(poisoned) < len(results), "the other batches answered"
    assert client.post("/predict", json={"data": [[3, 0, 0]]}).status_code == 200


def test_a_full_queue_answers_503_with_retry_after(client_factory: Any, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, "SlowRuntime", batching="{max_batch_size: 1, max_queue_size: 2}", options="{delay_s: 0.3}"
    )
    client = client_factory(spec)
    with ThreadPoolExecutor(8) as pool:
        statuses = [
            r.status_code for r in pool.map(lambda i: client.post("/predict", json={"data": [[i, 0, 0]]}), range(8))
        ]
    assert 503 in statuses
    assert statuses.count(200) >= 3
    refused = client.post("/predict", json={"data": [[0, 0, 0]]})
    assert refused.status_code in (200, 503)


def test_a_request_whose_deadline_passes_in_the_queue_never_runs(client_factory: Any, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "SlowRuntime", batching="{max_batch_size: 1}", options="{delay_s: 0.4}")
    client = client_factory(spec)

    def ask(args: tuple[int, dict[str, str]]) -> Any:
        value, headers = args
        return client.post("/predict", json={"data": [[value, 0, 0]]}, headers=headers)

    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(ask, (1, {}))
        import time

        time.sleep(0.1)
        late = pool.submit(ask, (99, {"X-Request-Timeout-Ms": "100"}))
        assert slow.result().status_code == 200
        response = late.result()
    assert response.status_code == 504
    assert "deadline" in response.json()["error"]
    assert 99.0 not in model_of(client).seen, "the expired request never ran"


def test_a_bad_timeout_header_is_a_400(client_factory: Any, tmp_path: Path) -> None:
    client = client_factory(write_spec(tmp_path, "EchoRuntime", batching="{max_batch_size: 4}"))
    response = client.post("/predict", json={"data": [[1, 2, 3]]}, headers={"X-Request-Timeout-Ms": "soon"})
    assert response.status_code == 400
    assert "milliseconds" in response.json()["expected"]


def test_a_partial_batch_flushes_after_max_latency(client_factory: Any, tmp_path: Path) -> None:
    client = client_factory(write_spec(tmp_path, "EchoRuntime", batching="{max_batch_size: 64, max_latency_ms: 50}"))
    import time

    started = time.monotonic()
    assert client.post("/predict", json={"data": [[1, 2, 3]]}).json() == {"prediction": [1.0, 2.0, 3.0]}
    elapsed = time.monotonic() - started
    assert 0.04 <= elapsed < 1.0, elapsed


def test_the_access_log_line_names_the_batch(client_factory: Any, tmp_path: Path, capfd: Any) -> None:
    client = client_factory(write_spec(tmp_path, "EchoRuntime", batching="{max_batch_size: 8}"), access_log=True)
    client.post("/predict", json={"data": [[1, 2, 3]]}, headers={"X-Request-ID": "follow-me"})
    client.app.access_log.flush()
    line = next(line for line in capfd.readouterr().err.splitlines() if "follow-me" in line)
    assert '"batches":{"model":{"batch_id":' in line
    assert '"batch_size":1' in line
    assert '"queue_wait_ms":' in line


def test_metrics_show_what_an_adaptive_batcher_learned(client_factory: Any, tmp_path: Path) -> None:
    client = client_factory(
        write_spec(tmp_path, "SumRuntime", batching="{max_batch_size: 8, max_latency_ms: 5, mode: adaptive}")
    )
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: client.post("/predict", json={"data": [[i, 1, 2]]}), range(48)))
    metrics = client.get("/metrics").text
    learned = [line for line in metrics.splitlines() if line.startswith("pipeserve_batch_learned_seconds_per_row{")]
    assert learned, "per-row cost by batch size"
    assert all('model="model"' in line and 'pipeline="batched"' in line for line in learned)
    assert all(float(line.rsplit(" ", 1)[1]) >= 0 for line in learned)
    metadata = client.get("/metadata").json()
    node = next(n for n in metadata["nodes"] if n["name"] == "model")
    sizes = {line.split('size="')[1].split('"')[0] for line in learned}
    assert sizes <= set(node["batching"]["learned_ms_per_row"]), "the gauges and /metadata tell the same sizes"


def test_a_fixed_batcher_knows_what_a_full_batch_costs_before_load(client_factory: Any, tmp_path: Path) -> None:
    # On a single core a batch runs on the event loop only when expected within the lane's budget: an estimate of
    # the full size taken from one cold run under load once kept full batches from ever running again.
    spec = write_spec(tmp_path, "SumRuntime", batching="{max_batch_size: 8, max_latency_ms: 5}")
    text = (spec / "pipeline.yaml").read_text()
    (spec / "pipeline.yaml").write_text(text.replace("  nodes:", "  sample: {data: [[1, 2, 3]]}\n  nodes:"))
    client = client_factory(spec)
    latency = client.app.service.pipeline.nodes["model"].batcher.latency
    assert set(latency.by_size()) == {1, 8}, "warm-up timed the warm-up's size and the full size"
    assert client.post("/predict", json={"data": [[1, 2, 3]]}).json()["prediction"] == [6.0]


def test_the_batch_overhead_is_read_from_the_spec_and_shown(client_factory: Any, tmp_path: Path) -> None:
    batching = "{max_batch_size: 8, mode: adaptive, batch_overhead_ms: 2.5}"
    client = client_factory(write_spec(tmp_path, "SumRuntime", batching=batching))
    assert client.app.service.pipeline.nodes["model"].batcher.policy.batch_overhead_s == pytest.approx(0.0025)
    node = next(n for n in client.get("/metadata").json()["nodes"] if n["name"] == "model")
    assert node["batching"]["batch_overhead_ms"] == pytest.approx(2.5)


def test_a_negative_batch_overhead_in_the_spec_is_refused(tmp_path: Path) -> None:
    from pipeserve import load_spec
    from pipeserve.errors import SpecError

    with pytest.raises(SpecError, match="batch_overhead_ms"):
        load_spec(write_spec(tmp_path, "SumRuntime", batching="{max_batch_size: 8, batch_overhead_ms: -1}"))


def test_a_full_batch_that_fails_at_warm_up_does_not_stop_the_server(client_factory: Any, tmp_path: Path) -> None:
    # A model with a fixed batch dimension, or one whose full batch does not fit in memory: the warm-up times only
    # what runs, and the server starts; a full batch fails its own callers when it runs.
    spec = write_spec(
        tmp_path, "FailingRuntime", batching="{max_batch_size: 8, max_latency_ms: 5}", options="{fail_above: 1}"
    )
    text = (spec / "pipeline.yaml").read_text()
    (spec / "pipeline.yaml").write_text(text.replace("  nodes:", "  sample: {data: [[1, 2, 3]]}\n  nodes:"))
    client = client_factory(spec)
    assert client.get("/health/ready").status_code == 200
    assert set(client.app.service.pipeline.nodes["model"].batcher.latency.by_size()) == {1}
    assert client.post("/predict", json={"data": [[1, 2, 3]]}).status_code == 200
