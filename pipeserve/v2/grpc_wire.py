"""gRPC over HTTP/2 as both ends write and read it (grpc/grpc ``doc/PROTOCOL-HTTP2.md``, ``doc/statuscodes.md``).

Status codes, the length-prefixed message, ``grpc-timeout``, ``grpc-message`` percent-encoding, compression, and
the HPACK header blocks our own endpoints send (literals that are never indexed, see ``http2.literal``).
"""

from __future__ import annotations

import gzip
import zlib
from urllib.parse import unquote_to_bytes

from pipeserve.v2.http2 import literal

# Status codes.
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
ALREADY_EXISTS, PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED = 6, 7, 8, 9, 10
OUT_OF_RANGE, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS, UNAUTHENTICATED = 11, 12, 13, 14, 15, 16

_NAMES = (
    "OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS PERMISSION_DENIED "
    "RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS "
    "UNAUTHENTICATED"
)
#: Status code -> its name, as grpcio's ``StatusCode`` spells it.
STATUS_NAMES = dict(enumerate(_NAMES.split()))

#: What a non-200 HTTP status means to a gRPC client (the protocol's table).
HTTP_STATUS_CODES = {400: INTERNAL, 401: UNAUTHENTICATED, 403: PERMISSION_DENIED, 404: UNIMPLEMENTED,
                     429: UNAVAILABLE, 502: UNAVAILABLE, 503: UNAVAILABLE, 504: UNAVAILABLE}  # fmt: skip

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
#: Request headers that are HTTP/2 or gRPC protocol, not the caller's metadata.
PROTOCOL_HEADERS = frozenset(
    {"content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "user-agent", "content-length"}
)


class GrpcWireError(Exception):
    """What a call ends with: a status ``code`` (one of the constants above) and its ``details``."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details

    @property
    def code_name(self) -> str:
        return STATUS_NAMES.get(self.code, f"CODE_{self.code}")


def parse_timeout(value: str) -> float:
    """``grpc-timeout`` in seconds (at most 8 digits and a unit).

    Raises:
        GrpcWireError: INVALID_ARGUMENT for anything else.
    """
    unit = _TIMEOUT_UNITS.get(value[-1:])
    if unit is None or not value[:-1].isdigit() or len(value) > 9:
        raise GrpcWireError(INVALID_ARGUMENT, f"malformed grpc-timeout {value!r}")
    return int(value[:-1]) * unit


def format_timeout(seconds: float) -> str:
    """``seconds`` as ``grpc-timeout`` (milliseconds, rounded up, or a coarser unit past 8 digits)."""
    millis = max(1, int(seconds * 1000 + 0.999))
    if millis < 100_000_000:
        return f"{millis}m"
    whole = max(1, int(seconds + 0.999))
    return f"{whole}S" if whole < 100_000_000 else f"{max(1, whole // 3600)}H"


def encode_message(details: str) -> str:
    """``grpc-message``: bytes outside printable ASCII, and '%' itself, percent-encoded."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in details.encode())


def decode_message(value: str) -> str:
    return unquote_to_bytes(value).decode("utf-8", errors="replace")


def frame_message(message: bytes | memoryview) -> bytes:
    """A message as gRPC carries it: uncompressed flag, 4-byte length, the message."""
    return len(message).to_bytes(5, "big") + message


def unframe_message(body: bytes | bytearray | memoryview, encoding: str | None) -> bytes | memoryview:
    """The one message of a unary call's body (decompressed if it says so).

    Raises:
        GrpcWireError: no message, more than one, or a compression we cannot read.
    """
    if len(body) < 5:
        raise GrpcWireError(UNIMPLEMENTED if not body else INTERNAL, "a unary call carries exactly one message")
    size = int.from_bytes(body[1:5], "big")
    if len(body) != 5 + size:
        raise GrpcWireError(INTERNAL, f"the message frame says {size} bytes, the stream carried {len(body) - 5}")
    message: bytes | memoryview = memoryview(body)[5:]
    if body[0]:
        message = _decompress(encoding or "identity", message)
    return message


def _decompress(encoding: str, message: bytes | memoryview) -> bytes:
    try:
        if encoding == "gzip":
            return gzip.decompress(message)
        if encoding == "deflate":
            return zlib.decompress(message)
    except (OSError, zlib.error, EOFError) as exc:
        raise GrpcWireError(INTERNAL, f"cannot decompress the {encoding} message: {exc}") from None
    if encoding == "identity":
        raise GrpcWireError(INTERNAL, "a compressed message without grpc-encoding")
    raise GrpcWireError(UNIMPLEMENTED, f"grpc-encoding {encoding} is not supported (identity, gzip, deflate are)")


_STATUS_200 = b"\x88"  # ":status: 200" is entry 8 of HPACK's static table
#: A successful answer's header block and trailer block.
OK_HEADERS = _STATUS_200 + literal("content-type", "application/grpc")
OK_TRAILERS = literal("grpc-status", "0")


def status_block(code: int, details: str) -> bytes:
    """A trailers-only answer: the HTTP status, the content type and the gRPC status in one header block."""
    block = OK_HEADERS + literal("grpc-status", str(code))
    if details:
        block += literal("grpc-message", encode_message(details))
    return block
