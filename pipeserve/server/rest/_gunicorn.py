"""The gunicorn worker class: uvicorn's, with pipeserve's logging and no uvicorn access log."""

from __future__ import annotations

from typing import Any, ClassVar

from uvicorn_worker import UvicornWorker


class PipeserveWorker(UvicornWorker):  # type: ignore[misc]
    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        "log_config": None,
        "access_log": False,
        "server_header": False,
        "lifespan": "on",
    }
