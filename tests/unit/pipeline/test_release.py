"""release: the fingerprint over everything that must stay in step, and the golden check."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from pipeserve.errors import GoldenCheckFailed
from pipeserve.pipeline.loader import load_spec
from pipeserve.pipeline.release import check_golden, fingerprint, golden_prediction, release_files

SPEC = """
pipeline:
  name: rel
  labels: labels.txt
  sample: {file: samples/input.bin}
  golden: {prediction_file: golden.json, label: b, atol: 1.0e-3, rtol: 0}
  nodes:
  - name: pre
    model_load_meta: {handler_module: "m1.pre:Pre"}
  - name: clf
    model_load_meta: {runtime: onnx, artifact: models/model.onnx}
  - name: post
    model_load_meta: {runtime: torchscript, artifact: models/saved}
"""


@pytest.fixture
def release_dir(tmp_path: Path) -> Path:
    root = tmp_path / "release"
    files = {
        "pipeline.yaml": textwrap.dedent(SPEC).lstrip(),
        "m1/pre.py": "class Pre:\n    def predict(self, data):\n        return data\n",
        "labels.txt": "a\nb\n",
        "samples/input.bin": "\x00\x01\x02",
        "golden.json": "[0.2, 0.8]",
        "models/saved/weights.bin": "w" * 64,
        "models/saved/config.json": "{}",
        "README.md": "notes that are not part of the release\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    (root / "models" / "model.onnx").write_bytes(bytes(range(256)) * 8)
    return root


def current(root: Path) -> str:
    return fingerprint(load_spec(root))


def flip_byte(path: Path, index: int) -> None:
    data = bytearray(path.read_bytes())
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


# --- fingerprint ---------------------------------------------------------------------------------------------


def test_fingerprint_is_16_hex_digits_and_stable(release_dir):
    first = current(release_dir)

    assert len(first) == 16
    int(first, 16)
    assert current(release_dir) == first


def test_fingerprint_does_not_depend_on_where_the_release_lives(release_dir, tmp_path):
    moved = shutil.copytree(release_dir, tmp_path / "elsewhere" / "copy")

    assert current(moved) == current(release_dir)


def test_unrelated_files_do_not_change_the_fingerprint(release_dir):
    before = current(release_dir)
    (release_dir / "README.md").write_text("edited", encoding="utf-8")

    assert current(release_dir) == before


def test_any_python_source_in_the_spec_folder_is_part_of_the_release(release_dir):
    # A handler's helper module is code the release runs, even though the spec does not name it.
    before = current(release_dir)
    (release_dir / "m1" / "helpers.py").write_text("X = 1\n", encoding="utf-8")

    assert current(release_dir) != before


def test_one_artifact_byte_changes_it_and_reverting_restores_it(release_dir):
    before = current(release_dir)
    artifact = release_dir / "models" / "model.onnx"

    flip_byte(artifact, 1000)
    assert current(release_dir) != before

    flip_byte(artifact, 1000)
    assert current(release_dir) == before


def test_a_file_inside_an_artifact_folder_changes_it(release_dir):
    before = current(release_dir)

    flip_byte(release_dir / "models" / "saved" / "weights.bin", 0)

    assert current(release_dir) != before


def test_spec_text_changes_it(release_dir):
    before = current(release_dir)
    spec = release_dir / "pipeline.yaml"
    spec.write_text(spec.read_text(encoding="utf-8") + "# a comment is still an edit\n", encoding="utf-8")

    assert current(release_dir) != before


def test_handler_source_changes_it(release_dir):
    before = current(release_dir)
    (release_dir / "m1" / "pre.py").write_text(
        "class Pre:\n    def predict(self, data):\n        return data * 2\n", encoding="utf-8"
    )

    assert current(release_dir) != before


@pytest.mark.parametrize("name", ["labels.txt", "samples/input.bin", "golden.json"])
def test_labels_sample_and_golden_files_change_it(release_dir, name):
    before = current(release_dir)

    flip_byte(release_dir / name, 0)

    assert current(release_dir) != before


def test_release_files_lists_what_the_fingerprint_covers(release_dir):
    loaded = load_spec(release_dir)

    names = {path.relative_to(loaded.base_dir).as_posix() for path in release_files(loaded)}

    assert names == {
        "m1/pre.py",
        "models/model.onnx",
        "models/saved/weights.bin",
        "models/saved/config.json",
        "labels.txt",
        "samples/input.bin",
        "golden.json",
    }


# --- golden check --------------------------------------------------------------------------------------------


def write_golden_spec(directory: Path, golden: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pipeline.yaml").write_text(
        f"pipeline: {{name: g, golden: {golden}, nodes: [{{name: a, step: softmax}}]}}\n", encoding="utf-8"
    )
    return directory


def test_golden_from_file(release_dir):
    loaded = load_spec(release_dir)

    assert golden_prediction(loaded) == [0.2, 0.8]
    assert check_golden(loaded, [0.2004, 0.7996], "b") == "prediction matches, label 'b'"


def test_golden_passes_within_atol(tmp_path):
    loaded = load_spec(write_golden_spec(tmp_path, "{prediction: [[0.2, 0.8]], atol: 0.001, rtol: 0}"))

    assert check_golden(loaded, [[0.2009, 0.7991]], None) == "prediction matches"


def test_golden_fails_beyond_atol_and_says_where(tmp_path):
    loaded = load_spec(write_golden_spec(tmp_path, "{prediction: [[0.2, 0.8], [0.5, 0.5]], atol: 0.001, rtol: 0}"))

    with pytest.raises(GoldenCheckFailed) as info:
        check_golden(loaded, [[0.2, 0.8], [0.5, 0.52]], None)

    message = str(info.value)
    assert "up to 0.02" in message
    assert "index [1, 1]" in message
    assert "golden 0.5" in message
    assert "got 0.52" in message
    assert "atol=0.001" in message


def test_golden_rtol_widens_the_tolerance(tmp_path):
    loaded = load_spec(write_golden_spec(tmp_path, "{prediction: [100.0], atol: 0, rtol: 0.01}"))

    assert check_golden(loaded, [100.9], None) == "prediction matches"
    with pytest.raises(GoldenCheckFailed):
        check_golden(loaded, [101.1], None)


def test_golden_shape_mismatch(tmp_path):
    loaded = load_spec(write_golden_spec(tmp_path, "{prediction: [[0.2, 0.8]]}"))

    with pytest.raises(GoldenCheckFailed, match=r"shape \(1, 2\).*\(2,\)"):
        check_golden(loaded, [0.2, 0.8], None)


def test_golden_nan_prediction_fails(tmp_path):
    loaded = load_spec(write_golden_spec(tmp_path, "{prediction: [0.5, 0.5]}"))

    with pytest.raises(GoldenCheckFailed):
        check_golden(loaded, [float("nan"), 0.5], None)


def test_golden_label_mismatch(tmp_path):
    loaded = load_spec(write_golden_spec(tmp_path, "{prediction: [1.0], label: tiger cat}"))

    with pytest.raises(GoldenCheckFailed) as info:
        check_golden(loaded, [1.0], "tabby cat")

    assert "'tiger cat'" in str(info.value)
    assert "'tabby cat'" in str(info.value)


def test_golden_label_only(tmp_path):
    loaded = load_spec(write_golden_spec(tmp_path, "{label: setosa}"))

    assert check_golden(loaded, "anything", "setosa") == "label 'setosa'"


def test_golden_non_numeric_prediction(tmp_path):
    loaded = load_spec(write_golden_spec(tmp_path, '{prediction: {"class": "cat", "scores": [1, 2]}}'))

    assert check_golden(loaded, {"class": "cat", "scores": [1, 2]}, None) == "prediction matches"
    with pytest.raises(GoldenCheckFailed, match="differs"):
        check_golden(loaded, {"class": "dog", "scores": [1, 2]}, None)


def test_no_golden_configured(tmp_path):
    directory = tmp_path / "plain"
    directory.mkdir()
    (directory / "pipeline.yaml").write_text("pipeline: {name: p, nodes: [{name: a, step: softmax}]}\n")
    loaded = load_spec(directory)

    assert golden_prediction(loaded) is None
    assert check_golden(loaded, [1.0], "x") == "no golden output configured"


def test_golden_file_is_json(release_dir):
    (release_dir / "golden.json").write_text(json.dumps({"p": [1, 2]}), encoding="utf-8")

    assert golden_prediction(load_spec(release_dir)) == {"p": [1, 2]}
