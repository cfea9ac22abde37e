"""Handler pipelines, golden checks and spec errors through the REST app and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeserve.cli.main import cli


def test_the_seed_pipeline_runs_in_next_order(client_factory: Any, seed_dir: Path) -> None:
    client = client_factory(seed_dir)
    response = client.post("/predict", json={"data": {"value": 7}})
    assert response.status_code == 200
    assert response.json() == {"prediction": {"value": 7, "visited": ["m1", "m3"]}}
    # No sample in the seed spec: the test endpoints say how to add one.
    missing = client.get("/predict/test")
    assert missing.status_code == 404
    assert "pipeline.sample" in missing.json()["error"]


def test_a_failing_handler_names_its_node(client_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text(
        "class Boom:\n    def predict(self, data):\n        raise KeyError('secret detail')\n"
    )
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: boom\n  nodes:\n  - name: explode\n    model_load_meta: {handler_module: steps}\n"
    )
    client = client_factory(tmp_path)
    response = client.post("/predict", json={"data": 1})
    assert response.status_code == 500
    assert response.json()["node"] == "explode"
    assert "secret detail" not in response.text  # internals stay in the log
    assert client.get("/health").json() == {"health": "ok"}


def test_async_handlers_run_on_the_loop(client_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text(
        "import asyncio\n"
        "class Double:\n    async def predict(self, data):\n        await asyncio.sleep(0)\n        return data * 2\n"
        "class AddOne:\n    def predict(self, data):\n        return data + 1\n"
    )
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: arith\n  nodes:\n"
        "  - name: double\n    model_load_meta: {handler_module: 'steps:Double'}\n"
        "  - name: add\n    model_load_meta: {handler_module: 'steps:AddOne'}\n"
    )
    assert client_factory(tmp_path).post("/predict", json={"data": 20}).json() == {"prediction": 41}


def test_a_golden_mismatch_keeps_the_server_up_but_not_ready(
    client_factory: Any, iris_dir: Path, copy_example: Any
) -> None:
    spec_dir = copy_example(iris_dir)
    (spec_dir / "golden.json").write_text(json.dumps([0.1, 0.8, 0.1]))
    client = client_factory(spec_dir)
    ready = client.get("/health/ready")
    assert ready.status_code == 503
    assert "golden check failed" in ready.json()["reason"]
    assert client.get("/health/live").status_code == 200
    refused = client.post("/predict/label", json={"data": [[5.1, 3.5, 1.4, 0.2]]})
    assert refused.status_code == 503
    assert "golden check failed" in refused.json()["error"]
    assert refused.headers["retry-after"]


def test_check_command_reports_ready(iris_dir: Path) -> None:
    result = CliRunner().invoke(cli, ["check", str(iris_dir), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ready"] is True
    assert report["golden"] == "prediction matches, label 'setosa'"


def test_check_command_fails_on_golden_mismatch(iris_dir: Path, copy_example: Any) -> None:
    spec_dir = copy_example(iris_dir)
    text = (spec_dir / "pipeline.yaml").read_text().replace("label: setosa", "label: virginica")
    (spec_dir / "pipeline.yaml").write_text(text)
    result = CliRunner().invoke(cli, ["check", str(spec_dir)])
    assert result.exit_code == 1
    assert "golden label is 'virginica'" in result.output


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (("next: m3", "next: m9"), "node 'm1': field 'next': unknown node 'm9'"),
        (("handler_module: m2.dummy_python_model", "handler_module: m2.nothing_here"), "node 'm2'"),
    ],
)
def test_check_command_names_the_bad_node(
    seed_dir: Path, copy_example: Any, edit: tuple[str, str], needle: str
) -> None:
    spec_dir = copy_example(seed_dir)
    text = (spec_dir / "pipeline.yaml").read_text().replace(*edit)
    if "m2" in edit[1]:  # make m2 reachable so that its handler is imported
        text = text.replace("next: m3", "next: m2")
    (spec_dir / "pipeline.yaml").write_text(text)
    result = CliRunner().invoke(cli, ["check", str(spec_dir)])
    assert result.exit_code == 2
    assert needle in result.output
    assert "pipeline.yaml" in result.output


def test_a_sample_that_fails_keeps_the_server_up_but_not_ready(client_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text("def predict(data):\n    return 1 / data\n")
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: divide\n  sample: {data: 0}\n  nodes:\n"
        "  - name: invert\n    model_load_meta: {handler_module: steps}\n"
    )
    client = client_factory(tmp_path)
    ready = client.get("/health/ready")
    assert ready.status_code == 503
    assert "sample input failed during warm-up" in ready.json()["reason"]
    assert "invert" in ready.json()["reason"]
    assert client.post("/predict", json={"data": 4}).status_code == 503


async def test_single_core_runs_sync_work_on_the_loop_one_request_at_a_time_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import threading

    from pipeserve import InferenceService, load_spec
    from pipeserve.pipeline import executor

    (tmp_path / "steps.py").write_text(
        "import threading, time\n"
        "ORDER = []\n"
        "def predict(data):\n"
        "    ORDER.append(data)\n"
        "    time.sleep(0.01)\n"
        "    return [len(ORDER), threading.current_thread().name]\n"
    )
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: where\n  sample: {data: 0}\n  nodes:\n"
        "  - name: where\n    model_load_meta: {handler_module: steps}\n"
    )
    monkeypatch.setattr(executor, "available_cores", lambda: 1)
    service = InferenceService(load_spec(tmp_path))
    await service.start()
    try:
        plan = service.pipeline.execution_plan()
        assert "one job at a time" in plan["predict"][0]["runs_in"]
        ticks = 0

        async def ticker() -> None:  # the loop keeps turning between jobs: health checks would be answered
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        tick_task = asyncio.create_task(ticker())
        answers = await asyncio.gather(*(service.predict(i) for i in range(1, 9)))
        tick_task.cancel()
        assert [thread for _, thread in answers] == [threading.current_thread().name] * 8  # on the loop, no hop
        positions = [position for position, _ in answers]
        assert positions == sorted(positions), "the requests ran in arrival order"
        assert ticks >= 7, f"the loop turned only {ticks} times between 8 jobs"
    finally:
        await service.stop()


async def test_several_cores_always_use_the_worker_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeserve import InferenceService, load_spec
    from pipeserve.pipeline import executor

    (tmp_path / "steps.py").write_text(
        "import threading\ndef predict(data):\n    return threading.current_thread().name\n"
    )
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: where\n  sample: {data: 1}\n  nodes:\n"
        "  - name: where\n    model_load_meta: {handler_module: steps}\n"
    )
    monkeypatch.setattr(executor, "available_cores", lambda: 2)
    service = InferenceService(load_spec(tmp_path))
    await service.start()
    try:
        assert (await service.predict(1)).startswith("pipeline-where")
    finally:
        await service.stop()


def _fake_model_spec(spec_dir: Path, runtime: str, delay_s: float, batching: str, *, per_row: bool = False) -> Path:
    """A pipeline of one fake model (tests/fakes.py) on rows of 2 numbers, sleeping ``delay_s`` per batch (per row
    with ``per_row``)."""
    (spec_dir / "weights.bin").write_bytes(b"\0")
    (spec_dir / "pipeline.yaml").write_text(
        "pipeline:\n  name: echo\n  input: {kind: tensor, shape: [-1, 2]}\n  sample: {data: [[1, 2]]}\n  nodes:\n"
        f"  - name: model\n    model_load_meta: {{runtime: 'tests.fakes:{runtime}', artifact: weights.bin,"
        f" options: {{delay_s: {delay_s}, per_row: {str(per_row).lower()}}}}}\n    batching: {batching}\n"
    )
    return spec_dir


@pytest.mark.parametrize(("cores", "on_lane"), [(1, True), (2, False)])
async def test_on_one_core_batches_take_their_turn_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, on_lane: bool
) -> None:
    import asyncio

    from pipeserve import InferenceService, load_spec
    from pipeserve.pipeline import executor

    spec = _fake_model_spec(tmp_path, "SlowRuntime", 0.002, "{max_batch_size: 4}")
    monkeypatch.setattr(executor, "available_cores", lambda: cores)
    service = InferenceService(load_spec(spec))
    await service.start()
    try:
        model = service.pipeline.models[0]
        assert (model.lane is not None) is on_lane
        assert ("one job at a time" in model.describe()["execution"]) is on_lane
        answers = await asyncio.gather(*(service.predict([[i, i + 1]]) for i in range(6)))
        assert [a.tolist() for a in answers] == [[float(i), float(i + 1)] for i in range(6)]
        assert model.batcher is not None
        assert (model.batcher.gate is not None) is on_lane
        if model.lane is not None:
            assert model.lane.jobs >= 1, "the batches took their turns on the lane (on the event loop)"
    finally:
        await service.stop()


@pytest.mark.parametrize(("runtime", "cpu_timed"), [("SleepOnCallingThreadRuntime", True), ("SlowRuntime", False)])
async def test_an_engine_on_the_calling_thread_is_costed_by_cpu_time_others_by_the_clock(
    tmp_path: Path, runtime: str, cpu_timed: bool
) -> None:
    """What the batcher learns for an engine that computes on the calling thread is that thread's CPU time, not
    the wall time a busy core stretches it to (a worker thread sharing one core with the event loop): a model
    that sleeps 50 ms costs next to nothing. A runtime that may wait on I/O or threads of its own keeps the
    clock. In adaptive mode the cost model starts from a warm run of every size it tries, not from cold runs."""
    from pipeserve import InferenceService, load_spec

    spec = _fake_model_spec(tmp_path, runtime, 0.05, "{max_batch_size: 4, mode: adaptive}")
    service = InferenceService(load_spec(spec))
    await service.start()
    try:
        model = service.pipeline.models[0]
        assert model.batcher is not None
        assert model.batcher.latency.sizes_seen == 3, "sizes 1, 2 and 4 ran warm after the warm-up"
        one = model.batcher.latency.estimate(1)
        assert one is not None
        assert (one < 0.02) is cpu_timed, f"{one} s"
        assert model.fastest_run_s is not None
        assert model.fastest_run_s >= 0.05, "wall time is still what it is"
        learned = model.describe()["batching"]  # what /metadata shows
        assert list(learned["learned_ms_per_row"]) == ["1", "2", "4"]
        if not cpu_timed:  # 50 ms a batch by the clock: 4 rows cost least per row
            assert learned["best_size"] == 4
    finally:
        await service.stop()


async def test_on_one_core_a_request_too_big_for_the_lanes_budget_runs_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row fits the lane's 100 ms, so the model takes turns on the event loop; a request of 8 rows takes 8 times
    as long (timed at warm-up), so it runs in a worker thread (the loop keeps answering) while holding the lane."""
    import asyncio
    import threading

    from pipeserve import InferenceService, load_spec
    from pipeserve.pipeline import executor

    spec = _fake_model_spec(tmp_path, "SlowRuntime", 0.04, "{max_batch_size: 8}", per_row=True)
    monkeypatch.setattr(executor, "available_cores", lambda: 1)
    service = InferenceService(load_spec(spec))
    await service.start()
    try:
        model = service.pipeline.models[0]
        assert model.lane is not None
        fake: Any = model.runtime
        loop_thread = threading.current_thread().name
        fake.threads.clear()
        await service.predict([[1, 2]])
        big = await asyncio.wait_for(service.predict([[i, i] for i in range(8)]), 10)
        assert big.shape == (8, 2)
        assert fake.threads == [loop_thread, fake.threads[1]], "one row: on the event loop"
        assert fake.threads[1] != loop_thread, "8 rows, ~0.32 s: in a worker thread"
    finally:
        await service.stop()


@pytest.mark.parametrize("batches_of_one_cheapest", [True, False])
async def test_on_one_core_a_model_runs_in_its_preprocessings_turn_unless_a_batch_would_pay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batches_of_one_cheapest: bool
) -> None:
    """Preprocessing (a handler) then an adaptively batched model, on one core. A request that is the only one in
    progress, or whose model costs least in batches of one, takes one turn on the CPU lane, preprocessing and model
    together, as it would without batching. Requests that arrive together, for a model whose batches pay, queue
    for a turn of the model's own and run in batches."""
    import asyncio
    import threading

    from pipeserve import InferenceService, load_spec
    from pipeserve.pipeline import executor

    (tmp_path / "weights.bin").write_bytes(b"\0")
    (tmp_path / "prep.py").write_text("def predict(data):\n    return [[float(v) * 10 for v in row] for row in data]\n")
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: fused\n  input: {kind: tensor, shape: [-1, 2]}\n  sample: {data: [[1, 2]]}\n  nodes:\n"
        "  - name: prep\n    model_load_meta: {handler_module: prep}\n"
        "  - name: model\n    model_load_meta: {runtime: 'tests.fakes:SlowRuntime', artifact: weights.bin,"
        " options: {delay_s: 0.001}}\n"
        "    batching: {max_batch_size: 4, max_latency_ms: 5, mode: adaptive}\n"
    )
    monkeypatch.setattr(executor, "available_cores", lambda: 1)
    service = InferenceService(load_spec(tmp_path))
    await service.start()
    try:
        model = service.pipeline.models[0]
        assert model.lane is not None
        assert model.batcher is not None
        assert "model in the same turn" in service.pipeline.execution_plan()["predict"][0]["runs_in"]
        latency = model.batcher.latency
        latency.forget()
        latency.observe(1, 0.001)
        latency.observe(4, 0.008 if batches_of_one_cheapest else 0.002)
        model.batcher._batch_counter = 1  # not due to explore
        fake: Any = model.runtime
        fake.batches.clear()
        fake.threads.clear()
        jobs = model.lane.jobs
        for i in range(5):  # one at a time: each the only request in progress
            answer = await service.predict([[i, i + 1]])
            assert answer.tolist() == [float(i * 10), float((i + 1) * 10)]
        turns = model.lane.jobs - jobs
        assert fake.batches == [1] * 5
        assert fake.threads == [threading.current_thread().name] * 5, "on the event loop, no thread hop"
        assert turns == 5, f"{turns} lane turns for 5 requests"
        fake.batches.clear()
        answers = await asyncio.gather(*(service.predict([[i, i]]) for i in range(8)))
        assert [a.tolist() for a in answers] == [[float(i * 10)] * 2 for i in range(8)]
        if batches_of_one_cheapest:
            assert fake.batches == [1] * 8
        else:
            assert max(fake.batches) > 1, f"requests that arrived together met in a batch: {fake.batches}"
    finally:
        await service.stop()
