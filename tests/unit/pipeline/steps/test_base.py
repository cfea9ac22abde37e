"""create_step: built-in step names, parameter validation, and errors that name the node and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeserve.errors import SpecError
from pipeserve.pipeline.steps import STEPS, Step, StepContext, create_step
from pipeserve.pipeline.steps.image import Decode
from pipeserve.pipeline.steps.tensor import Softmax

CONTEXT = StepContext(node="post", base_dir=Path("."), labels=("cat", "dog", "bird"))
NO_LABELS = StepContext(node="post", base_dir=Path("."))


def spec_error(name: str, params: dict[str, object], context: StepContext = CONTEXT) -> SpecError:
    with pytest.raises(SpecError) as info:
        create_step(name, params, context, file="pipeline.yaml")
    err = info.value
    assert err.file == "pipeline.yaml"
    assert err.node == context.node
    assert str(err).startswith(f"pipeline.yaml: node '{context.node}': field '{err.field}': ")
    return err


@pytest.mark.parametrize("name", sorted(STEPS))
def test_every_built_in_step_builds_with_its_defaults(name):
    params = {"short_side": 8} if name == "image.resize" else {"size": 4} if name == "image.center_crop" else {}

    step = create_step(name, params, CONTEXT)

    assert isinstance(step, Step)
    assert step.context is CONTEXT


def test_params_are_parsed_into_the_step_model():
    step = create_step("softmax", {"axis": 0}, CONTEXT)

    assert isinstance(step, Softmax)
    assert isinstance(step.params, Softmax.Params)
    assert step.params.axis == 0


def test_heavy_steps_are_marked_so():
    assert create_step("image.decode", {}, CONTEXT).is_cpu_heavy is True
    assert create_step("softmax", {}, CONTEXT).is_cpu_heavy is False


def test_unknown_step_lists_the_built_in_ones():
    err = spec_error("image.rezise", {})

    assert err.field == "step"
    assert "'image.rezise'" in str(err)
    assert "image.resize" in str(err)


def test_step_by_import_string():
    step = create_step("pipeserve.pipeline.steps.image:Decode", {"mode": "L"}, CONTEXT)

    assert isinstance(step, Decode)


def test_import_string_that_is_not_a_step():
    err = spec_error("json:dumps", {})

    assert err.field == "step"
    assert "not a pipeserve Step" in str(err)


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("softmax", {"axis": "last"}, "params.axis"),
        ("softmax", {"axsi": 1}, "params.axsi"),
        ("top_k", {"k": 0}, "params.k"),
        ("image.decode", {"mode": "CMYK"}, "params.mode"),
        ("image.decode", {"max_pixels": 0}, "params.max_pixels"),
        ("image.resize", {"short_side": 0}, "params.short_side"),
        ("image.resize", {"size": [0, 10]}, "params.size"),
        ("image.resize", {"short_side": 8, "interpolation": "cubic"}, "params.interpolation"),
        ("image.center_crop", {}, "params.size"),
        ("image.to_tensor", {"layout": "CHW"}, "params.layout"),
        ("image.normalize", {"layout": "CHW"}, "params.layout"),
        ("image.normalize", {"scale": 0}, "params.scale"),
        ("image.normalize", {"dtype": "int8"}, "params.dtype"),
    ],
)
def test_bad_params_name_the_node_and_field(name, params, field):
    err = spec_error(name, params)

    assert err.field == field
    assert f"(step {name!r})" in str(err)


@pytest.mark.parametrize("params", [{}, {"short_side": 8, "size": [8, 8]}], ids=["neither", "both"])
def test_resize_needs_exactly_one_of_short_side_or_size(params):
    err = spec_error("image.resize", params)

    assert err.field == "params"
    assert "short_side" in str(err)


@pytest.mark.parametrize("size", [0, [5, -1]], ids=["zero", "negative-height"])
def test_center_crop_rejects_sizes_that_are_not_positive(size):
    err = spec_error("image.center_crop", {"size": size})

    assert err.field is not None
    assert err.field.startswith("params.size")


@pytest.mark.parametrize("std", [0.0, [1.0, 0.0, 1.0]], ids=["all", "one-channel"])
def test_normalize_rejects_a_zero_std(std):
    err = spec_error("image.normalize", {"std": std})

    assert err.field is not None
    assert err.field.startswith("params")


@pytest.mark.parametrize("name", ["top_k", "label"])
def test_label_steps_need_labels(name):
    err = spec_error(name, {}, NO_LABELS)

    assert err.field == "step"
    assert "labels" in str(err)
