"""Structured logging: one JSON object per line on stderr, with the request id when there is one."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from pipeserve.observability.context import request_id_var

ACCESS_LOGGER = "pipeserve.access"
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime", "taskName", "color_message"}
)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line; ``extra={...}`` fields become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _iso_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        if request_id:
            entry["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key != "request_id":
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """Human-readable lines for development: time, level, logger, message, request id."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        extras = {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS and k != "request_id"}
        if request_id:
            line += f" [{request_id}]"
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


def _iso_time(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Send pipeserve's and uvicorn's logs to stderr in one format. Idempotent; call once per process."""
    numeric = logging.DEBUG if level in ("debug", "trace") else getattr(logging, level.upper(), logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    for name in ("pipeserve", "uvicorn", "uvicorn.error", "gunicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [handler] if name in ("pipeserve", "uvicorn", "gunicorn.error") else []
        logger.setLevel(numeric)
        logger.propagate = name == "uvicorn.error"
    # uvicorn's own access log would duplicate ours, which carries the request id and latency.
    logging.getLogger("uvicorn.access").handlers = []
    logging.getLogger("uvicorn.access").propagate = False
