"""Offline batch scoring with real models and worker processes: outputs identical to /predict, errors, resume."""

from __future__ import annotations

import base64
import csv
import dataclasses
import re
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from pipeserve.cli.main import cli
from pipeserve.offline.io import InputOptions
from pipeserve.offline.scorer import ScoreOptions, ScoringFailed, score


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def _prediction(line: bytes) -> tuple[str, bytes]:
    match = re.fullmatch(rb'\{"key":(".*?"),"prediction":(.*)\}', line)
    assert match, line
    return orjson.loads(match.group(1)), match.group(2)


def _predict_bytes(client: Any, path: str, data: Any) -> bytes:
    body = client.post(path, json={"data": data}).content
    match = re.fullmatch(rb'\{"prediction":(.*)\}', body)
    assert match, body
    return match.group(1)


@pytest.fixture(scope="module")
def iris_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.datasets import load_iris

    path = tmp_path_factory.mktemp("iris") / "iris.csv"
    data = load_iris()
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["id", "sepal_length", "sepal_width", "petal_length", "petal_width"])
        for i, row in enumerate(data.data):
            writer.writerow([f"flower-{i:03d}", *row])
    return path


def test_the_iris_csv_scores_exactly_as_predict_answers(
    iris_dir: Path, iris_csv: Path, tmp_path: Path, iris_client: Any
) -> None:
    output = tmp_path / "iris.jsonl"
    report = score(
        ScoreOptions(iris_dir, iris_csv, output, input_options=InputOptions(id_column="id"), workers=2, progress=False)
    )
    assert (report.total, report.scored, report.failed, report.skipped) == (150, 150, 0, 0)
    with iris_csv.open() as file:
        rows = list(csv.DictReader(file))
    lines = [_prediction(line) for line in _lines(output)]
    assert [key for key, _ in lines] == [row["id"] for row in rows]  # input order
    for (key, prediction), row in zip(lines, rows, strict=True):
        data = [[float(row[c]) for c in ("sepal_length", "sepal_width", "petal_length", "petal_width")]]
        assert prediction == _predict_bytes(iris_client, "/predict", data), key


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory, cat_jpeg: bytes) -> Path:
    import skimage.data
    from PIL import Image

    folder = tmp_path_factory.mktemp("photos")
    (folder / "cat.jpg").write_bytes(cat_jpeg)
    (folder / "more").mkdir()
    Image.fromarray(skimage.data.coffee()).save(folder / "more" / "coffee.png")
    Image.fromarray(skimage.data.rocket()).save(folder / "rocket.jpg", quality=90)
    (folder / "notes.txt").write_text("not an image at all")
    return folder


def test_a_folder_of_images_matches_predict_and_a_bad_file_goes_to_the_errors(
    client_factory: Any, imagenet_dir: Path, photos: Path, tmp_path: Path
) -> None:
    output = tmp_path / "labels.jsonl"
    # The default endpoint (ONNX Runtime, unbatched): the very bytes /predict answers. (Through a micro-batched
    # model a result's last float32 digit may depend on the batch it ran in; see docs/jobs.md.)
    report = score(ScoreOptions(imagenet_dir, photos, output, progress=False))
    assert (report.total, report.scored, report.failed) == (4, 3, 1)
    client = client_factory(imagenet_dir)
    lines = dict(_prediction(line) for line in _lines(output))
    assert list(lines) == ["cat.jpg", "more/coffee.png", "rocket.jpg"]  # sorted by path; notes.txt failed
    for key, prediction in lines.items():
        encoded = base64.b64encode((photos / key).read_bytes()).decode()
        assert prediction == _predict_bytes(client, "/predict", encoded), key
    [error] = [orjson.loads(line) for line in _lines(tmp_path / "labels.errors.jsonl")]
    assert error["key"] == "notes.txt"
    assert "not a decodable image" in error["error"]


def test_jsonl_bodies_and_labels_through_the_cli(imagenet_dir: Path, cat_jpeg: bytes, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    encoded = base64.b64encode(cat_jpeg).decode()
    source.write_text(
        "\n".join(orjson.dumps(line).decode() for line in [{"id": "cat", "data": encoded}, {"data": "%%%"}]) + "\n"
    )
    output = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        cli,
        [
            "batch",
            str(imagenet_dir),
            "--input",
            str(source),
            "--output",
            str(output),
            "--endpoint",
            "label",
            "--no-progress",
            "--json",
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.output)
    assert (report["scored"], report["failed"]) == (1, 1)
    assert orjson.loads(_lines(output)[0]) == {"key": "cat", "prediction": "tiger cat"}
    [error] = [orjson.loads(line) for line in _lines(tmp_path / "out.errors.jsonl")]
    assert error["key"] == "2"
    assert "base64" in error["error"]


def test_a_rerun_skips_what_is_done_and_redoes_a_torn_line(iris_dir: Path, iris_csv: Path, tmp_path: Path) -> None:
    options = ScoreOptions(
        iris_dir,
        iris_csv,
        tmp_path / "out.jsonl",
        input_options=InputOptions(id_column="id"),
        progress=False,
        workers=1,
    )
    score(options)
    complete = _lines(options.output)
    # As if the run had been killed: the last 10 results missing and the one before torn mid-line.
    options.output.write_bytes(b"\n".join(complete[:139]) + b"\n" + complete[139][:15])
    report = score(options)
    assert (report.skipped, report.scored) == (139, 11)
    assert sorted(_lines(options.output)) == sorted(complete)  # every record exactly once, same results
    again = score(options)
    assert (again.skipped, again.scored) == (150, 0)


def test_a_worker_that_dies_stops_the_run_and_keeps_what_was_written(tmp_path: Path) -> None:
    spec = tmp_path / "spec"
    spec.mkdir()
    (spec / "steps.py").write_text(
        "import os\ndef predict(data):\n    if data == 'crash':\n        os._exit(3)\n    return data\n"
    )
    (spec / "pipeline.yaml").write_text(
        "pipeline:\n  name: crashy\n  nodes:\n  - name: step\n    model_load_meta: {handler_module: steps}\n"
    )
    source = tmp_path / "in.jsonl"
    source.write_text("".join(f'{{"data": "{"crash" if i == 40 else i}"}}\n' for i in range(50)))
    options = ScoreOptions(spec, source, tmp_path / "out.jsonl", workers=1, chunk_size=8, progress=False)
    with pytest.raises(ScoringFailed, match=r"died .*run the same command again to resume"):
        score(options)
    kept = [orjson.loads(line)["key"] for line in _lines(options.output)]
    assert kept == [str(i) for i in range(1, len(kept) + 1)]
    assert len(kept) >= 32, "the chunks before the crash are on disk"


def test_bad_options_are_refused_with_the_fix(iris_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "x.csv"
    source.write_text("a\n1\n")
    result = CliRunner().invoke(
        cli, ["batch", str(iris_dir), "--input", str(source), "--output", str(tmp_path / "o.csv"), "--no-progress"]
    )
    assert result.exit_code == 2
    assert "*.jsonl" in result.output
    result = CliRunner().invoke(
        cli,
        ["batch", str(iris_dir), "--input", str(source), "--output", str(tmp_path / "o.jsonl"), "--param", "k"],
    )
    assert result.exit_code == 2
    assert "NAME=VALUE" in result.output


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Data's own (use_push_based_shuffle)
def test_the_ray_engine_writes_what_the_local_engine_writes(iris_dir: Path, iris_csv: Path, tmp_path: Path) -> None:
    local = ScoreOptions(
        iris_dir, iris_csv, tmp_path / "local.jsonl", input_options=InputOptions(id_column="id"), progress=False
    )
    ray = dataclasses.replace(local, output=tmp_path / "ray.jsonl", engine="ray", workers=2)
    score(local)
    report = score(ray)
    assert (report.scored, report.failed) == (150, 0)
    assert _lines(ray.output) == _lines(local.output)
    shutil.rmtree(tmp_path / "ray-session", ignore_errors=True)
