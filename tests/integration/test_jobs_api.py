"""The asynchronous API on the embedded queue: POST /jobs -> 202, GET /jobs/{id}, retries, dead letters, webhooks."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeserve.config import JobSettings
from tests.webhooks import HookReceiver

ROW = [[5.1, 3.5, 1.4, 0.2]]


def _result_bytes(job_body: bytes) -> bytes:
    match = re.search(rb',"result":(.*)}$', job_body)
    assert match, job_body
    return match.group(1)


def _prediction_bytes(predict_body: bytes) -> bytes:
    match = re.fullmatch(rb'\{"prediction":(.*)}', predict_body)
    assert match, predict_body
    return match.group(1)


def test_a_job_answers_202_and_then_exactly_what_predict_answers(iris_client: Any) -> None:
    accepted = iris_client.post("/jobs", json={"data": ROW})
    assert accepted.status_code == 202
    body = accepted.json()
    assert body["status"] == "queued"
    assert re.fullmatch(r"[0-9a-f]{32}", body["id"])
    assert accepted.headers["location"] == body["url"] == f"/jobs/{body['id']}"
    done = iris_client.get(f"{body['url']}?wait=10")
    assert done.status_code == 200
    assert done.json()["status"] == "done"
    assert done.json()["attempts"] == 1
    predicted = iris_client.post("/predict", json={"data": ROW})
    assert _result_bytes(done.content) == _prediction_bytes(predicted.content)


def test_label_jobs_answer_the_class_name(iris_client: Any) -> None:
    job = iris_client.post("/jobs/label", json={"data": ROW}).json()
    assert iris_client.get(f"/jobs/{job['id']}?wait=10").json()["result"] == "setosa"


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/jobs", {"data": [[5.1, 3.5]]}, 400, "shape [1, 2]"),
        ("/jobs", {"nodata": 1}, 400, "no 'data' field"),
        ("/jobs", {"data": ROW, "callback_url": "ftp://x"}, 400, "not an http(s) URL"),
        ("/jobs/nope", {"data": ROW}, 404, "no endpoint 'nope'"),
    ],
)
def test_bad_submissions_are_refused_at_once(
    iris_client: Any, path: str, body: dict[str, Any], status: int, fragment: str
) -> None:
    answer = iris_client.post(path, json=body)
    assert answer.status_code == status
    assert fragment in answer.json()["error"]


def test_bad_job_ids_and_unknown_jobs(iris_client: Any) -> None:
    bad = iris_client.get("/jobs/not-an-id")
    assert bad.status_code == 400
    assert "not a job id" in bad.json()["error"]
    unknown = iris_client.get("/jobs/" + "0" * 32)
    assert unknown.status_code == 404
    assert "no job" in unknown.json()["error"]
    assert iris_client.get("/jobs/" + "0" * 32 + "?wait=999").status_code == 400  # longer than MAX_WAIT_S


def test_an_uploaded_image_job_matches_predict_and_a_non_image_fails_naming_it(
    client_factory: Any, imagenet_dir: Path, cat_jpeg: bytes
) -> None:
    client = client_factory(imagenet_dir)
    job = client.post("/jobs/tag?k=3", files={"image": ("cat.jpg", cat_jpeg, "image/jpeg")}).json()
    done = client.get(f"/jobs/{job['id']}?wait=30")
    assert done.json()["status"] == "done"
    predicted = client.post("/predict/tag?k=3", json={"data": base64.b64encode(cat_jpeg).decode()})
    assert _result_bytes(done.content) == _prediction_bytes(predicted.content)
    assert done.json()["result"][0]["name"] in {"tiger cat", "tabby", "Egyptian cat"}

    bad = client.post("/jobs", files={"image": ("notes.txt", b"just text, no pixels", "text/plain")}).json()
    failed = client.get(f"/jobs/{bad['id']}?wait=30").json()
    assert failed["status"] == "failed"
    assert failed["error_kind"] == "invalid_input"
    assert "not a decodable image" in failed["error"]
    assert failed["attempts"] == 1, "a bad input is not retried"


@pytest.fixture
def flaky_spec(tmp_path: Path) -> Path:
    (tmp_path / "steps.py").write_text(
        "import time\n"
        "class Flaky:\n"
        "    def predict(self, data):\n"
        "        if data == 'poison':\n"
        "            raise ValueError('this input always breaks the model')\n"
        "        if data == 'slow':\n"
        "            time.sleep(0.5)\n"
        "        return {'echo': data}\n"
    )
    (tmp_path / "pipeline.yaml").write_text(
        "pipeline:\n  name: flaky\n  nodes:\n  - name: flaky\n    model_load_meta: {handler_module: 'steps:Flaky'}\n"
    )
    return tmp_path


def test_a_job_that_keeps_failing_is_retried_then_dead_lettered_and_others_are_unharmed(
    client_factory: Any, flaky_spec: Path
) -> None:
    client = client_factory(flaky_spec, jobs=JobSettings(max_attempts=3))
    poison = client.post("/jobs", json={"data": "poison"}).json()["id"]
    fine = client.post("/jobs", json={"data": "fine"}).json()["id"]
    assert client.get(f"/jobs/{fine}?wait=10").json()["result"] == {"echo": "fine"}
    deadline = time.monotonic() + 20
    while (failed := client.get(f"/jobs/{poison}?wait=5").json())["status"] != "failed":
        assert time.monotonic() < deadline, failed
    assert failed["attempts"] == 3
    assert failed["error_kind"] == "gave_up"
    assert "gave up after 3 attempts" in failed["error"]
    assert "pipeline node 'flaky' failed (ValueError)" in failed["error"]
    assert "always breaks" not in failed["error"], "internals stay in the log"
    queue = client.app.jobs
    assert [(d["id"], d["attempts"]) for d in queue.dead] == [(poison, 3)]


def test_a_full_queue_answers_503_with_retry_after(client_factory: Any, flaky_spec: Path) -> None:
    client = client_factory(flaky_spec, jobs=JobSettings(max_queued=2, concurrency=1))
    first = client.post("/jobs", json={"data": "slow"})
    second = client.post("/jobs", json={"data": "slow"})
    assert (first.status_code, second.status_code) == (202, 202)
    refused = client.post("/jobs", json={"data": "slow"})
    assert refused.status_code == 503
    assert int(refused.headers["retry-after"]) >= 1
    assert "queue is full" in refused.json()["error"]
    assert client.post("/predict", json={"data": "fine"}).status_code == 200, "real-time traffic is unaffected"


@pytest.fixture
def hooks() -> Iterator[HookReceiver]:
    receiver = HookReceiver(failures=2)
    yield receiver
    receiver.close()


def test_the_finished_job_is_posted_to_its_callback_once_after_retries(iris_client: Any, hooks: HookReceiver) -> None:
    job = iris_client.post("/jobs/label", json={"data": ROW, "callback_url": hooks.url}).json()
    assert iris_client.get(f"/jobs/{job['id']}?wait=10").json()["status"] == "done"
    deadline = time.monotonic() + 15
    while not hooks.received:
        assert time.monotonic() < deadline, "the webhook never arrived"
        time.sleep(0.05)
    time.sleep(0.3)  # nothing more comes
    assert hooks.attempts == 3  # two 503s, then delivered
    [(job_id, body)] = hooks.received
    assert job_id == job["id"]
    assert (body["id"], body["status"], body["result"]) == (job["id"], "done", "setosa")


def test_the_callback_header_works_for_uploads_too(
    client_factory: Any, imagenet_dir: Path, cat_jpeg: bytes, hooks: HookReceiver
) -> None:
    hooks.failures = 0
    client = client_factory(imagenet_dir)
    job = client.post(
        "/jobs/label", files={"image": ("cat.jpg", cat_jpeg, "image/jpeg")}, headers={"X-Callback-Url": hooks.url}
    ).json()
    assert client.get(f"/jobs/{job['id']}?wait=30").json()["status"] == "done"
    deadline = time.monotonic() + 15
    while not hooks.received:
        assert time.monotonic() < deadline, "the webhook never arrived"
        time.sleep(0.05)
    assert hooks.received[0][1]["result"] in {"tiger cat", "tabby", "Egyptian cat"}


def test_an_unreachable_redis_answers_503_naming_it_and_predict_keeps_serving(
    client_factory: Any, iris_dir: Path
) -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = client_factory(iris_dir, redis_url=f"redis://:secret@127.0.0.1:{port}/0")
    refused = client.post("/jobs", json={"data": ROW})
    assert refused.status_code == 503
    assert f"redis://127.0.0.1:{port}/0 is unreachable" in refused.json()["error"]
    assert "secret" not in refused.text, "the password stays out of error messages"
    assert client.get("/jobs/" + "0" * 32).status_code == 503
    assert client.post("/predict", json={"data": ROW}).status_code == 200
