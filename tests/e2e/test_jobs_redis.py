"""The queue pattern with real processes: `pipeserve serve --redis` takes jobs, `pipeserve worker` processes run them.

500 jobs through 2 workers, one SIGKILLed midway: every job completes with the right result, none is lost, and
each is reported once (its result never changes); poison jobs reach the dead-letter stream.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import yaml

from tests.e2e.conftest import PIPESERVE, run_server, stop
from tests.webhooks import HookReceiver


def _spec(source: Path, target: Path, *, handler: str) -> Path:
    """The iris example under a unique pipeline name (its own Redis keys), with a handler node after the model."""
    import shutil

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / "after.py").write_text(handler)
    spec = yaml.safe_load((target / "pipeline.yaml").read_text())
    spec["pipeline"]["name"] = f"iris-{uuid.uuid4().hex[:8]}"
    spec["pipeline"]["nodes"][0]["next"] = "after"
    spec["pipeline"]["nodes"].append({"name": "after", "model_load_meta": {"handler_module": "after:After"}})
    (target / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return target


SLOW = """
import time
class After:
    def predict(self, probabilities):
        time.sleep(0.02)  # a slower model: jobs are still in progress when a worker is killed
        return probabilities
"""


@contextmanager
def workers(
    spec: Path, redis_url: str, tmp_path: Path, count: int, env: dict[str, str]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    processes = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    try:
        for i in range(count):
            with (tmp_path / f"worker-{i}.log").open("wb") as log:
                processes.append(
                    subprocess.Popen(
                        [
                            *PIPESERVE,
                            "worker",
                            str(spec),
                            "--redis",
                            redis_url,
                            "--name",
                            f"w{i}",
                            "--log-format",
                            "text",
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, **env},
                        start_new_session=True,
                    )
                )
        for i, process in enumerate(processes):
            _wait_for_log(tmp_path / f"worker-{i}.log", b"running", process)
        yield processes
    finally:
        for process in processes:
            stop(process)


def _wait_for_log(path: Path, text: bytes, process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker did not start:\n{path.read_text(errors='replace')}")
        time.sleep(0.2)


def _cleanup(redis_url: str, pipeline: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"pipeserve:{{{pipeline}}}:*"))
    if keys:
        client.delete(*keys)


@pytest.mark.slow
def test_500_jobs_survive_a_worker_killed_midway(iris_dir: Path, redis_url: str, tmp_path: Path) -> None:
    spec = _spec(iris_dir, tmp_path / "spec", handler=SLOW)
    pipeline = yaml.safe_load((spec / "pipeline.yaml").read_text())["pipeline"]["name"]
    env = {
        "PIPESERVE_JOB_VISIBILITY_TIMEOUT_S": "2",
        "PIPESERVE_JOB_CONCURRENCY": "16",
        "PIPESERVE_JOB_WEBHOOK_LEASE_S": "3",  # a webhook the killed worker was sending is resent soon after
    }
    hooks = HookReceiver(failures=0)
    rng = np.random.default_rng(7)
    rows = [[round(float(v), 2) for v in rng.uniform([4.3, 2.0, 1.0, 0.1], [7.9, 4.4, 6.9, 2.5])] for _ in range(500)]
    try:
        with (
            run_server(["serve", str(spec), "--redis", redis_url], tmp_path=tmp_path, env=env) as server,
            httpx.Client(base_url=server.url, timeout=30) as client,
        ):
            ids = []
            for row in rows:  # all queued before any worker runs: the backlog is there when one is killed
                answer = client.post("/jobs", json={"data": [row], "callback_url": hooks.url})
                assert answer.status_code == 202, answer.text
                ids.append(answer.json()["id"])
            expected = [client.post("/predict", json={"data": [row]}).json()["prediction"] for row in rows]
            assert client.get(f"/jobs/{ids[0]}").json()["status"] == "queued"

            def finished() -> int:
                return 10 * sum(int(client.get(f"/jobs/{job}").json()["status"] == "done") for job in ids[::10])

            with workers(spec, redis_url, tmp_path, 2, env) as (victim, survivor):
                while finished() < 100:  # let both workers get going, then kill one in the middle of its jobs
                    time.sleep(0.05)
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait()

                deadline = time.monotonic() + 90
                results: dict[str, Any] = {}
                while len(results) < len(ids):
                    assert time.monotonic() < deadline, f"{len(ids) - len(results)} jobs never finished"
                    for job in ids:
                        if job not in results:
                            body = client.get(f"/jobs/{job}?wait=0").json()
                            if body["status"] in ("done", "failed"):
                                results[job] = body
                    time.sleep(0.2)
                assert survivor.poll() is None

                assert [results[job]["status"] for job in ids] == ["done"] * len(ids)
                assert [results[job]["result"] for job in ids] == expected
                rerun = [job for job in ids if results[job]["attempts"] > 1]
                assert rerun, "the killed worker had jobs in progress; another worker must have finished them"
                # Reported once: polling again gives the same result, never a second one.
                assert [client.get(f"/jobs/{job}").json()["result"] for job in ids] == expected

                deadline = time.monotonic() + 30
                while len({job for job, _ in hooks.received}) < len(ids):
                    assert time.monotonic() < deadline, "webhooks missing"
                    time.sleep(0.1)
                by_job: dict[str, list[Any]] = {}
                for job, body in hooks.received:
                    by_job.setdefault(job, []).append(body["result"])
                assert set(by_job) == set(ids)
                # At least once: a worker killed between sending and recording it may cause a rare duplicate,
                # which then carries the very same result.
                assert all(len(set(map(repr, sent))) == 1 for sent in by_job.values())
                assert sum(len(sent) - 1 for sent in by_job.values()) <= 16
    finally:
        hooks.close()
        _cleanup(redis_url, pipeline)


POISONED = """
import os
class After:
    def predict(self, probabilities):
        if probabilities.shape[0] == 3:  # the poison: a request with 3 rows
            if os.environ.get("POISON_KILLS"):
                os._exit(17)  # takes its worker down, as a segfault or the OOM killer would
            raise ValueError("three rows break this model")
        return probabilities
"""


@pytest.mark.slow
@pytest.mark.parametrize("kills", [False, True], ids=["raises", "kills-its-worker"])
def test_poison_jobs_reach_the_dead_letter_stream(iris_dir: Path, redis_url: str, tmp_path: Path, kills: bool) -> None:
    spec = _spec(iris_dir, tmp_path / "spec", handler=POISONED)
    pipeline = yaml.safe_load((spec / "pipeline.yaml").read_text())["pipeline"]["name"]
    env = {"PIPESERVE_JOB_VISIBILITY_TIMEOUT_S": "1", "PIPESERVE_JOB_MAX_ATTEMPTS": "2"}
    if kills:
        env["POISON_KILLS"] = "1"
    poison_rows = [[5.1, 3.5, 1.4, 0.2]] * 3
    try:
        with (
            run_server(["serve", str(spec), "--redis", redis_url], tmp_path=tmp_path, env=env) as server,
            httpx.Client(base_url=server.url, timeout=30) as client,
        ):
            poison = client.post("/jobs", json={"data": poison_rows}).json()["id"]
            good = client.post("/jobs", json={"data": [[6.7, 3.0, 5.2, 2.3]]}).json()["id"]
            deadline = time.monotonic() + 120
            generation = 0
            while client.get(f"/jobs/{poison}").json()["status"] != "failed":
                assert time.monotonic() < deadline, client.get(f"/jobs/{poison}").json()
                # A worker the poison killed is replaced, as an orchestrator would do.
                with workers(spec, redis_url, tmp_path / f"gen{generation}", 1, env) as (worker,):
                    while worker.poll() is None and client.get(f"/jobs/{poison}").json()["status"] != "failed":
                        assert time.monotonic() < deadline
                        time.sleep(0.1)
                    if kills and client.get(f"/jobs/{poison}").json()["status"] != "failed":
                        assert worker.wait() == 17
                generation += 1
            failed = client.get(f"/jobs/{poison}").json()
            assert failed["error_kind"] == "gave_up"
            assert "gave up after 2 attempts" in failed["error"]
            if kills:
                assert "stopped before it finished" in failed["error"]
                assert generation == 3  # two runs killed their workers; the third worker dead-lettered it
            else:
                assert "pipeline node 'after' failed (ValueError)" in failed["error"]
            assert client.get(f"/jobs/{good}?wait=20").json()["status"] == "done"
        dead: Any = redis.Redis.from_url(redis_url).xrange(f"pipeserve:{{{pipeline}}}:dead")
        assert [fields[b"id"].decode() for _, fields in dead] == [poison]
    finally:
        _cleanup(redis_url, pipeline)
