from __future__ import annotations

import json
import logging

import pytest

from pipeserve.observability.context import request_id_var
from pipeserve.observability.logging import JsonFormatter, TextFormatter, configure_logging


def _record(msg: str = "Loaded %s", args: tuple[object, ...] = ("iris",), **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("pipeserve.test", logging.WARNING, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_lines_carry_message_extras_and_the_request_id() -> None:
    token = request_id_var.set("req-7")
    try:
        line = JsonFormatter().format(_record(node="classifier", color_message="x"))
    finally:
        request_id_var.reset(token)
    entry = json.loads(line)
    assert entry["msg"] == "Loaded iris"
    assert entry["level"] == "warning"
    assert entry["logger"] == "pipeserve.test"
    assert entry["request_id"] == "req-7"
    assert entry["node"] == "classifier"
    assert "color_message" not in entry
    assert entry["ts"].endswith("Z")


def test_json_lines_include_the_traceback() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        import sys

        record = _record()
        record.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(record))
    assert "ValueError: broken" in entry["exc"]


def test_text_lines_are_readable() -> None:
    line = TextFormatter().format(_record(request_id="abc", node="n1"))
    assert "WARNING" in line
    assert "Loaded iris" in line
    assert "[abc]" in line
    assert "node=n1" in line


@pytest.mark.parametrize(
    ("level", "numeric"), [("debug", logging.DEBUG), ("trace", logging.DEBUG), ("warning", logging.WARNING)]
)
def test_configure_logging_sets_levels_and_one_handler(level: str, numeric: int) -> None:
    configure_logging(level, "text")
    configure_logging(level, "json")
    logger = logging.getLogger("pipeserve")
    assert logger.level == numeric
    assert len(logger.handlers) == 1
    assert isinstance(logger.handlers[0].formatter, JsonFormatter)
    assert logging.getLogger("uvicorn.access").handlers == []
