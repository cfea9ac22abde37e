"""One pipeline, three ways in: POST /predict, a job through Redis and a `pipeserve worker`, and `pipeserve batch`.
Every way gives the very same bytes for the same input.

(A micro-batched model is the one exception to bitwise identity: its engine rounds a batch of 8 differently from
a batch of 1 in the last float32 digit, so a request's bytes depend on the company it was batched with, through
any of the three ways alike. The tag endpoint below, two batched TorchScript models, is compared to 1e-5.)"""

from __future__ import annotations

import base64
import csv
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
import yaml

from tests.e2e.conftest import PIPESERVE, run_server
from tests.e2e.test_jobs_redis import workers


def _renamed(source: Path, target: Path) -> tuple[Path, str]:
    """A copy of an example under a unique pipeline name, so its Redis keys are its own."""
    import shutil

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    spec = yaml.safe_load((target / "pipeline.yaml").read_text())
    name = f"{spec['pipeline']['name']}-{uuid.uuid4().hex[:8]}"
    spec["pipeline"]["name"] = name
    (target / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return target, name


def _three_ways(
    spec: Path, redis_url: str, tmp_path: Path, path: str, inputs: dict[str, Any], offline: list[str]
) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, bytes]]:
    job_path = path.replace("/predict", "/jobs", 1)
    tmp_path.mkdir(parents=True, exist_ok=True)
    with (
        run_server(["serve", str(spec), "--redis", redis_url], tmp_path=tmp_path) as server,
        workers(spec, redis_url, tmp_path / "workers", 1, {}),
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        predicted = {}
        for key, data in inputs.items():
            match = re.fullmatch(rb'\{"prediction":(.*)\}', client.post(path, json={"data": data}).content)
            assert match, key
            predicted[key] = match.group(1)
        jobs = {key: client.post(job_path, json={"data": data}).json()["id"] for key, data in inputs.items()}
        queued = {}
        for key, job in jobs.items():
            body = client.get(f"/jobs/{job}?wait=30").content
            match = re.search(rb',"result":(.*)\}$', body)
            assert match, body
            queued[key] = match.group(1)
    output = tmp_path / "offline.jsonl"
    subprocess.run(
        [*PIPESERVE, "batch", str(spec), "--output", str(output), "--no-progress", *offline],
        check=True,
        capture_output=True,
    )
    scored = {}
    for line in output.read_bytes().splitlines():
        match = re.fullmatch(rb'\{"key":"(.*?)","prediction":(.*)\}', line)
        assert match, line
        scored[match.group(1).decode()] = match.group(2)
    return predicted, queued, scored


@pytest.mark.slow
def test_iris_rows_give_the_same_bytes_three_ways(iris_dir: Path, redis_url: str, tmp_path: Path) -> None:
    spec, name = _renamed(iris_dir, tmp_path / "spec")
    rows = {f"r{i}": [5.0 + i / 10, 3.0, 1.0 + i / 3, 0.2 + i / 10] for i in range(12)}
    table = tmp_path / "rows.csv"
    with table.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["key", "a", "b", "c", "d"])
        writer.writerows([key, *row] for key, row in rows.items())
    try:
        predicted, queued, scored = _three_ways(
            spec,
            redis_url,
            tmp_path,
            "/predict",
            {key: [row] for key, row in rows.items()},
            ["--input", str(table), "--id-column", "key"],
        )
        assert predicted == queued == scored
    finally:
        _cleanup(redis_url, name)


@pytest.mark.slow
def test_photos_give_the_same_bytes_three_ways(
    imagenet_dir: Path, redis_url: str, tmp_path: Path, cat_jpeg: bytes
) -> None:
    import skimage.data
    from PIL import Image

    spec, name = _renamed(imagenet_dir, tmp_path / "spec")
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "cat.jpg").write_bytes(cat_jpeg)
    Image.fromarray(skimage.data.coffee()).save(photos / "coffee.jpg", quality=90)
    Image.fromarray(skimage.data.astronaut()).save(photos / "astronaut.png")
    inputs = {p.name: base64.b64encode(p.read_bytes()).decode() for p in sorted(photos.iterdir())}
    try:
        # The whole network in ONNX Runtime, unbatched: the same bytes every way.
        predicted, queued, scored = _three_ways(
            spec, redis_url, tmp_path / "predict", "/predict", inputs, ["--input", str(photos)]
        )
        assert predicted == queued == scored
        # Two micro-batched TorchScript models: the same classes, probabilities equal to 1e-5.
        tags = _three_ways(
            spec,
            redis_url,
            tmp_path / "tag",
            "/predict/tag?k=5",
            inputs,
            ["--input", str(photos), "--endpoint", "tag", "--param", "k=5"],
        )
        decoded = [{key: orjson.loads(value) for key, value in way.items()} for way in tags]
        for way in decoded[1:]:
            assert way.keys() == decoded[0].keys()
            for key, top in way.items():
                assert [t["name"] for t in top] == [t["name"] for t in decoded[0][key]]
                assert [t["prob"] for t in top] == pytest.approx([t["prob"] for t in decoded[0][key]], abs=1e-5)
    finally:
        _cleanup(redis_url, name)


def _cleanup(redis_url: str, pipeline: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"pipeserve:{{{pipeline}}}:*"))
    if keys:
        client.delete(*keys)
