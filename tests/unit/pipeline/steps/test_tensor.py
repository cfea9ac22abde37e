"""Tensor steps: softmax, top_k, label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeserve.pipeline.steps import StepContext, create_step

LABELS = ("cat", "dog", "bird", "fish")
CONTEXT = StepContext(node="post", base_dir=Path("."), labels=LABELS)


def step(name: str, **params: Any) -> Any:
    """The step, typed loosely so tests can call it with step-specific arguments."""
    return create_step(name, params, CONTEXT)


# --- softmax -------------------------------------------------------------------------------------------------


def test_softmax_rows_sum_to_one_and_keep_order():
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [-5.0, 10.0, 0.5]])

    probs = step("softmax")(logits)

    assert probs.shape == (3, 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probs[1], [1 / 3] * 3, rtol=1e-6)
    assert list(np.argmax(probs, axis=1)) == [2, 0, 1]


def test_softmax_matches_the_textbook_formula():
    logits = np.array([[0.5, -1.25, 2.0, 0.0]])
    expected = np.exp(logits) / np.exp(logits).sum()

    np.testing.assert_allclose(step("softmax")(logits), expected, rtol=1e-6)


def test_softmax_is_stable_for_large_logits():
    probs = step("softmax")(np.array([[1000.0, 1001.0, -1000.0], [1e30, 0.0, -1e30]], dtype=np.float32))

    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs[0], [1 / (1 + np.e), np.e / (1 + np.e), 0.0], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(probs[1], [1.0, 0.0, 0.0])


def test_softmax_along_another_axis():
    probs = step("softmax", axis=0)(np.array([[1.0, 5.0], [1.0, 5.0]]))

    np.testing.assert_allclose(probs, [[0.5, 0.5], [0.5, 0.5]])


def test_softmax_of_integers():
    probs = step("softmax")(np.array([[0, 0]], dtype=np.int64))

    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs, [[0.5, 0.5]])


def test_softmax_refuses_non_numeric_values():
    with pytest.raises(TypeError, match="'post'"):
        step("softmax")(np.array(["a", "b"]))


# --- top_k ---------------------------------------------------------------------------------------------------


def test_top_k_best_first_with_labels():
    scores = np.array([[0.1, 0.6, 0.05, 0.25], [0.7, 0.0, 0.2, 0.1]])

    top = step("top_k", k=2)(scores)

    assert top == [
        [{"name": "dog", "prob": pytest.approx(0.6)}, {"name": "fish", "prob": pytest.approx(0.25)}],
        [{"name": "cat", "prob": pytest.approx(0.7)}, {"name": "bird", "prob": pytest.approx(0.2)}],
    ]


def test_top_k_default_is_five_capped_at_the_class_count():
    top = step("top_k")(np.array([[0.4, 0.3, 0.2, 0.1]]))

    assert [entry["name"] for entry in top[0]] == ["cat", "dog", "bird", "fish"]


def test_top_k_k_can_be_given_per_request():
    from pipeserve.pipeline.context import request_params

    token = request_params.set({"k": "1"})
    try:
        top = step("top_k", k=3)(np.array([[0.4, 0.3, 0.2, 0.1]]))
    finally:
        request_params.reset(token)

    assert top == [[{"name": "cat", "prob": pytest.approx(0.4)}]]


@pytest.mark.parametrize("k", ["0", "5", "x", "-1"])
def test_top_k_refuses_a_k_outside_the_labels(k):
    from pipeserve.errors import InvalidInput
    from pipeserve.pipeline.context import request_params

    token = request_params.set({"k": k})
    try:
        with pytest.raises(InvalidInput, match="k is"):
            step("top_k", k=3)(np.array([[0.4, 0.3, 0.2, 0.1]]))
    finally:
        request_params.reset(token)


def test_top_k_single_row_without_batch_dimension():
    assert step("top_k", k=1)(np.array([0.1, 0.2, 0.9, 0.3]))[0][0]["name"] == "bird"


def test_top_k_ties_keep_class_order():
    top = step("top_k", k=4)(np.array([[0.25, 0.25, 0.25, 0.25]]))

    assert [entry["name"] for entry in top[0]] == list(LABELS)


def test_top_k_probabilities_are_plain_floats():
    top = step("top_k", k=1)(np.array([[1.0, 0.0, 0.0, 0.0]], dtype=np.float32))

    assert type(top[0][0]["prob"]) is float


def test_top_k_on_unsigned_integer_scores():
    # Quantized models emit uint8 scores; negating them to sort would wrap around.
    top = step("top_k", k=2)(np.array([[0, 200, 10, 255]], dtype=np.uint8))

    assert [entry["name"] for entry in top[0]] == ["fish", "dog"]


# --- label ---------------------------------------------------------------------------------------------------


def test_label_of_the_best_score_per_row():
    scores = np.array([[0.1, 0.2, 0.6, 0.1], [0.9, 0.0, 0.05, 0.05]])

    assert step("label")(scores) == ["bird", "cat"]


def test_label_of_a_single_row():
    assert step("label")(np.array([0.0, 0.0, 0.0, 1.0])) == ["fish"]


def test_label_of_integer_class_ids():
    assert step("label")(np.array([3, 0, 1], dtype=np.int64)) == ["fish", "cat", "dog"]
