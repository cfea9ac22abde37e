"""Domain errors: message formats and the hierarchy transports map from."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeserve.errors import (
    DeadlineExceeded,
    GoldenCheckFailed,
    InvalidInput,
    NodeFailed,
    NotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    PipeserveError,
    SpecError,
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"file": "p.yaml", "node": "m1", "field": "next"}, "p.yaml: node 'm1': field 'next': unknown node 'm9'"),
        ({"file": Path("/srv/p.yaml"), "node": "m1"}, "/srv/p.yaml: node 'm1': unknown node 'm9'"),
        ({"file": "p.yaml", "field": "labels"}, "p.yaml: field 'labels': unknown node 'm9'"),
        ({"node": "m1", "field": "step"}, "node 'm1': field 'step': unknown node 'm9'"),
        ({}, "unknown node 'm9'"),
    ],
    ids=["all", "path-and-node", "file-and-field", "node-and-field", "bare"],
)
def test_spec_error_message_names_file_node_and_field(kwargs, message):
    err = SpecError("unknown node 'm9'", **kwargs)

    assert str(err) == message
    assert err.problem == "unknown node 'm9'"


def test_spec_error_keeps_its_parts():
    err = SpecError("bad", file=Path("/x/p.yaml"), node="m1", field="next")

    assert (err.file, err.node, err.field) == ("/x/p.yaml", "m1", "next")


def test_invalid_input_appends_what_is_expected():
    assert str(InvalidInput("'data' is a string", expected="a list of numbers")) == (
        "'data' is a string; expected a list of numbers"
    )
    assert str(InvalidInput("bad")) == "bad"
    assert InvalidInput("bad").expected is None


def test_payload_too_large():
    err = PayloadTooLarge(2048, 1024)

    assert isinstance(err, InvalidInput)
    assert err.limit_bytes == 1024
    assert str(err) == "request body is 2048 bytes; expected at most 1024 bytes"
    assert "over the limit" in str(PayloadTooLarge(None, 1024))


def test_overloaded_carries_retry_after():
    assert Overloaded("full", retry_after_s=2.5).retry_after_s == 2.5
    assert Overloaded("full").retry_after_s == 1.0


def test_node_failed_names_the_node_but_not_the_cause_message():
    cause = ValueError("secret path /etc/shadow")

    err = NodeFailed("classifier", cause)

    assert str(err) == "node 'classifier' failed (ValueError)"
    assert err.node == "classifier"
    assert err.cause is cause
    assert "secret" not in str(err)


@pytest.mark.parametrize(
    "cls", [SpecError, InvalidInput, NotReady, Overloaded, DeadlineExceeded, NodeFailed, GoldenCheckFailed, NotFound]
)
def test_every_error_is_a_pipeserve_error(cls):
    assert issubclass(cls, PipeserveError)


def test_spec_and_input_errors_are_value_errors():
    assert issubclass(SpecError, ValueError)
    assert issubclass(InvalidInput, ValueError)
    assert not issubclass(NotReady, ValueError)
