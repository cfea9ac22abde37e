"""load_spec: YAML -> checked spec and plan; every error names the file, the node and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipeserve.errors import SpecError
from pipeserve.pipeline.loader import load_spec


def write_spec(directory: Path, text: str, name: str = "pipeline.yaml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def load_error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value


def assert_names(err: SpecError, file: Path, node: str | None, field: str) -> None:
    message = str(err)
    assert str(file) in message, message
    if node is not None:
        assert f"node {node!r}" in message, message
    assert field in message, message


# --- the seed spec -----------------------------------------------------------------------------------------


def test_seed_spec_loads_exactly_as_written(seed_dir):
    loaded = load_spec(seed_dir)

    assert loaded.path == (seed_dir / "pipeline.yaml").resolve()
    assert loaded.spec.name == "test_pipeline"
    assert loaded.spec.start_node_name == "m1"
    assert [n.name for n in loaded.spec.nodes] == ["m1", "m2", "m3"]
    assert [n.kind for n in loaded.spec.nodes] == ["handler", "handler", "handler"]
    assert [n.model_load_meta.handler_module for n in loaded.spec.nodes if n.model_load_meta] == [
        "m1.dummy_python_model",
        "m2.dummy_python_model",
        "m3.dummy_python_model",
    ]
    assert [n.next for n in loaded.spec.nodes] == ["m3", None, None]
    assert loaded.plan.order == ("m1", "m3")
    assert loaded.plan.unreachable == ("m2",)
    assert loaded.labels is None


def test_seed_spec_warns_that_m2_is_unreachable(seed_dir):
    loaded = load_spec(seed_dir)

    assert len(loaded.warnings) == 1
    assert "'m2'" in loaded.warnings[0]
    assert "unreachable" in loaded.warnings[0]
    assert str(loaded.path) in loaded.warnings[0]


def test_load_spec_takes_the_file_or_its_folder(seed_dir):
    assert load_spec(seed_dir / "pipeline.yaml").plan == load_spec(seed_dir).plan


# --- finding the file ----------------------------------------------------------------------------------------


def test_pipeline_yml_is_found_too(tmp_path):
    write_spec(tmp_path, "pipeline: {name: p, nodes: [{name: a, step: softmax}]}", name="pipeline.yml")

    assert load_spec(tmp_path).plan.order == ("a",)


def test_folder_without_a_spec(tmp_path):
    err = load_error(tmp_path)

    assert str(tmp_path) in str(err)
    assert "pipeline.yaml" in str(err)


def test_path_that_does_not_exist(tmp_path):
    err = load_error(tmp_path / "nowhere")

    assert str(tmp_path / "nowhere") in str(err)


# --- what a valid spec gives ---------------------------------------------------------------------------------


def test_default_order_without_start_node(tmp_path):
    write_spec(
        tmp_path,
        """
        pipeline:
          name: p
          nodes:
          - {name: a, step: softmax}
          - {name: b, step: softmax}
        """,
    )

    loaded = load_spec(tmp_path)

    assert loaded.plan.order == ("a", "b")
    assert loaded.warnings == ()


def test_labels_from_a_file_skip_blank_lines_and_strip(tmp_path):
    write_spec(tmp_path, "pipeline: {name: p, labels: labels.txt, nodes: [{name: a, step: softmax}]}")
    (tmp_path / "labels.txt").write_text("cat\n  dog  \n\nbird\n", encoding="utf-8")

    assert load_spec(tmp_path).labels == ("cat", "dog", "bird")


def test_inline_labels(tmp_path):
    write_spec(tmp_path, "pipeline: {name: p, labels: [x, y], nodes: [{name: a, step: softmax}]}")

    assert load_spec(tmp_path).labels == ("x", "y")


def test_numeric_versions_become_strings(tmp_path):
    write_spec(
        tmp_path,
        """
        pipeline:
          name: p
          version: 2
          nodes:
          - name: m
            model_load_meta: {runtime: onnx, artifact: m.onnx, version: 3}
        """,
    )
    (tmp_path / "m.onnx").write_bytes(b"not really onnx; the loader does not open it")

    loaded = load_spec(tmp_path)

    assert loaded.spec.version == "2"
    assert loaded.spec.nodes[0].model_load_meta is not None
    assert loaded.spec.nodes[0].model_load_meta.version == "3"


def test_resolve_is_relative_to_the_spec_folder(tmp_path):
    write_spec(tmp_path / "deep", "pipeline: {name: p, nodes: [{name: a, step: softmax}]}")

    loaded = load_spec(tmp_path / "deep")

    assert loaded.base_dir == (tmp_path / "deep").resolve()
    assert loaded.resolve("models/x.onnx") == (tmp_path / "deep" / "models" / "x.onnx").resolve()


# --- errors --------------------------------------------------------------------------------------------------


def test_unknown_next(tmp_path):
    file = write_spec(
        tmp_path,
        """
        pipeline:
          name: p
          nodes:
          - {name: a, step: softmax, next: zz}
          - {name: b, step: softmax}
        """,
    )

    err = load_error(file)

    assert_names(err, file, "a", "next")
    assert "'zz'" in str(err)


def test_cycle(tmp_path):
    file = write_spec(
        tmp_path,
        """
        pipeline:
          name: p
          nodes:
          - {name: a, step: softmax, next: b}
          - {name: b, step: softmax, next: c}
          - {name: c, step: softmax, next: b}
        """,
    )

    err = load_error(file)

    assert_names(err, file, "c", "next")
    assert "b -> c -> b" in str(err)


def test_duplicate_node_names(tmp_path):
    file = write_spec(
        tmp_path,
        """
        pipeline:
          name: p
          nodes:
          - {name: a, step: softmax}
          - {name: a, step: top_k}
        """,
    )

    err = load_error(file)

    assert_names(err, file, "a", "name")
    assert "duplicate" in str(err)


def test_unknown_start_node_name(tmp_path):
    file = write_spec(
        tmp_path,
        """
        pipeline:
          name: p
          start_node_name: m9
          nodes:
          - {name: a, step: softmax}
        """,
    )

    err = load_error(file)

    assert_names(err, file, None, "start_node_name")
    assert "'m9'" in str(err)


def test_missing_artifact_file(tmp_path):
    file = write_spec(
        tmp_path,
        """
        pipeline:
          name: p
          nodes:
          - name: clf
            model_load_meta: {runtime: onnx, artifact: models/missing.onnx}
        """,
    )

    err = load_error(file)

    assert_names(err, file, "clf", "model_load_meta.artifact")
    assert "missing.onnx" in str(err)


def test_node_with_both_step_and_model_load_meta(tmp_path):
    file = write_spec(
        tmp_path,
        """
        pipeline:
          name: p
          nodes:
          - name: a
            step: softmax
            model_load_meta: {handler_module: m1.handler}
        """,
    )

    err = load_error(file)

    assert_names(err, file, "a", "step")
    assert "model_load_meta" in str(err)


@pytest.mark.parametrize(
    ("node_yaml", "field"),
    [
        ("{name: a, step: softmax, nxt: b}", "nxt"),
        ("{name: a, model_load_meta: {handler_modul: m1.h}}", "model_load_meta.handler_modul"),
        ("{name: a, step: softmax, batching: {max_batch_sise: 4}}", "batching.max_batch_sise"),
    ],
    ids=["node", "model_load_meta", "batching"],
)
def test_unknown_field_is_a_typo(tmp_path, node_yaml, field):
    file = write_spec(tmp_path, f"pipeline: {{name: p, nodes: [{node_yaml}]}}")

    err = load_error(file)

    assert_names(err, file, "a", field)
    assert "unknown field" in str(err)


def test_unknown_field_at_pipeline_level(tmp_path):
    file = write_spec(tmp_path, "pipeline: {name: p, start_node: a, nodes: [{name: a, step: softmax}]}")

    err = load_error(file)

    assert_names(err, file, None, "start_node")
    assert err.node is None


def test_invalid_yaml(tmp_path):
    file = write_spec(tmp_path, "pipeline:\n  name: p\n  nodes: [\n")

    err = load_error(file)

    assert str(file) in str(err)
    assert "not valid YAML" in str(err)
    assert "line" in str(err)


def test_yaml_python_tags_are_refused(tmp_path):
    file = write_spec(tmp_path, "pipeline: !!python/object/apply:os.system ['echo pwned']\n")

    err = load_error(file)

    assert "not valid YAML" in str(err)


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "pipeline: 3\n"], ids=["empty", "list", "scalar"])
def test_document_of_the_wrong_shape(tmp_path, text):
    file = write_spec(tmp_path, text)

    err = load_error(file)

    assert str(file) in str(err)


def test_missing_labels_file(tmp_path):
    file = write_spec(tmp_path, "pipeline: {name: p, labels: labels.txt, nodes: [{name: a, step: softmax}]}")

    err = load_error(file)

    assert_names(err, file, None, "labels")
    assert "labels.txt" in str(err)


def test_missing_sample_and_golden_files(tmp_path):
    sample = write_spec(
        tmp_path / "s", "pipeline: {name: p, sample: {file: cat.jpg}, nodes: [{name: a, step: softmax}]}"
    )
    golden = write_spec(
        tmp_path / "g", "pipeline: {name: p, golden: {prediction_file: g.json}, nodes: [{name: a, step: softmax}]}"
    )

    assert_names(load_error(sample), sample, None, "sample.file")
    assert_names(load_error(golden), golden, None, "golden.prediction_file")


def test_bad_value_names_node_by_position_when_it_has_no_name(tmp_path):
    file = write_spec(tmp_path, "pipeline: {name: p, nodes: [{name: a, step: softmax}, {step: softmax}]}")

    err = load_error(file)

    assert_names(err, file, "#2", "name")


def test_several_problems_are_all_reported(tmp_path):
    file = write_spec(
        tmp_path,
        """
        pipeline:
          name: p
          nodes:
          - {name: a, step: softmax, nxt: b}
          - {name: b, step: softmax, parms: {}}
        """,
    )

    err = load_error(file)

    assert_names(err, file, "a", "nxt")
    assert_names(err, file, "b", "parms")


def test_spec_error_is_chained_to_its_cause(tmp_path):
    file = write_spec(tmp_path, "pipeline: {name: p, nodes: [{name: a, step: softmax, nxt: b}]}")

    err = load_error(file)

    assert err.__cause__ is not None
