"""Request ids: callers' sane ids are honoured, anything else is replaced."""

from __future__ import annotations

import re

import pytest

from pipeserve.observability.context import accept_request_id, new_request_id, next_batch_id

GENERATED = re.compile(r"^[0-9a-f]{16}$")


@pytest.mark.parametrize(
    "incoming",
    [
        "abc",
        "3f2a9c1e-7b4d-4e8a-9f00-1234567890ab",
        "trace.id:span/1+2=3@host_x",
        "x" * 128,
    ],
    ids=["short", "uuid", "punctuation", "128-chars"],
)
def test_sane_ids_are_honoured(incoming):
    assert accept_request_id(incoming) == incoming


@pytest.mark.parametrize(
    "incoming",
    [
        None,
        "",
        "x" * 129,
        "has space",
        "tab\there",
        "new\nline",
        "trailing-newline\n",
        'quote"d',
        "<script>",
        "caf\u00e9",
    ],
    ids=["none", "empty", "129-chars", "space", "tab", "newline", "trailing-newline", "quote", "html", "non-ascii"],
)
def test_bad_ids_are_replaced(incoming):
    accepted = accept_request_id(incoming)

    assert accepted != incoming
    assert GENERATED.match(accepted)


def test_new_ids_are_unique():
    ids = {new_request_id() for _ in range(1000)}

    assert len(ids) == 1000
    assert all(GENERATED.match(i) for i in ids)


def test_batch_ids_increase():
    first = next_batch_id()

    assert next_batch_id() == first + 1
