"""The request id of the work in progress, for log lines written deep in the pipeline."""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from itertools import count

request_id_var: ContextVar[str | None] = ContextVar("pipeserve_request_id", default=None)

_VALID_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")
_counter = count(1)


def new_request_id() -> str:
    """A fresh id: 16 random hex digits, unique across processes and restarts."""
    return os.urandom(8).hex()


def accept_request_id(incoming: str | None) -> str:
    """Honour a caller's ``X-Request-ID`` when it is a sane token (<= 128 URL-safe chars), else make one."""
    if (
        incoming
        and len(incoming) <= 128
        and ((incoming.isascii() and incoming.isalnum()) or _VALID_ID.fullmatch(incoming))
    ):
        return incoming
    return new_request_id()


def next_batch_id() -> int:
    """A process-wide increasing batch number, for following a request into its batch in the logs."""
    return next(_counter)
