"""``inference.GRPCInferenceService`` over ModelService: raw output contents, domain errors as status codes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc

from pipeserve.config import GrpcEngine
from pipeserve.errors import DeadlineExceeded, InvalidInput, NotFound, NotReady, Overloaded, PipeserveError
from pipeserve.observability import tracing
from pipeserve.observability.context import accept_request_id, request_id_var
from pipeserve.pipeline.context import requests_in_progress
from pipeserve.server.v2.grpc_server import GrpcServer, UnaryMethod
from pipeserve.server.v2.http2 import Http2Limits
from pipeserve.service.models import ModelService
from pipeserve.v2 import RELEASE_PARAMETER, grpc_codec
from pipeserve.v2._proto import inference_pb2 as pb
from pipeserve.v2.datatypes import select_outputs
from pipeserve.v2.grpc_service import MAX_MESSAGE_BYTES, MESSAGE_OPTIONS, METHODS, SERVICE, add_servicer, server_codec
from pipeserve.v2.infer_proto import InferRequest, InferResponse

logger = logging.getLogger("pipeserve.server.grpc")
T = TypeVar("T")

#: Domain errors -> gRPC status (Triton's mapping; overload is RESOURCE_EXHAUSTED so clients do not take the
#: server for dead, as they do on UNAVAILABLE).
_STATUS: list[tuple[type[Exception], grpc.StatusCode]] = [
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (NotReady, grpc.StatusCode.UNAVAILABLE),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
]


class GrpcInferenceServicer:
    """The RPCs, named as in the protocol."""

    def __init__(self, service: ModelService) -> None:
        self.service = service
        #: The calls this server has received and not answered (set by a server that knows): a batched model runs
        #: a request alone at once only when it is the only one.
        self.calls_in_progress: Callable[[], int] | None = None

    async def _answer(self, context: Any, call: Callable[..., Awaitable[T]], *args: Any) -> T:
        try:
            return await call(*args)
        except PipeserveError as exc:
            code = next((c for kind, c in _STATUS if isinstance(exc, kind)), grpc.StatusCode.INTERNAL)
            await context.abort(code, str(exc))
        except Exception:
            logger.exception("gRPC call failed")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error (logged on the server)")
        raise AssertionError("unreachable")  # context.abort raises

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.is_ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        async def call() -> pb.ModelReadyResponse:
            return pb.ModelReadyResponse(ready=self.service.entry(request.name, request.version).state == "READY")

        return await self._answer(context, call)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        meta = self.service.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        async def call() -> pb.ModelMetadataResponse:
            meta = self.service.model_metadata(request.name, request.version)
            response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
            for field in ("inputs", "outputs"):
                for tensor in meta[field]:
                    getattr(response, field).add(
                        name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
                    )
            grpc_codec.set_parameters(response.parameters, meta["parameters"])
            return response

        return await self._answer(context, call)

    async def ModelInfer(self, request: InferRequest, context: Any) -> InferResponse:
        """Read by ``infer_proto.decode_request``, written by ``infer_proto.encode_response`` (``server_codec``)."""
        message = request.message
        token = request_id_var.set(accept_request_id(message.id))  # the caller's job id, on our spans and logs
        counted = requests_in_progress.set(self.calls_in_progress) if self.calls_in_progress is not None else None
        try:
            if not tracing.enabled():  # the hot path: no span, no metadata scan
                return await self._answer(context, self._infer, request, context)
            carrier = {key: value for key, value in context.invocation_metadata() or () if key == "traceparent"}
            with tracing.span(f"v2 infer {message.model_name}", kind="server", carrier=carrier):
                return await self._answer(context, self._infer, request, context)
        finally:
            request_id_var.reset(token)
            if counted is not None:
                requests_in_progress.reset(counted)

    async def _infer(self, request: InferRequest, context: Any) -> InferResponse:
        message = request.message
        inputs = request.tensors()
        timeout_s = _timeout(context, request.parameters())
        entry, outputs = await self.service.infer(
            message.model_name, message.model_version, inputs, timeout_s=timeout_s
        )
        selected = select_outputs(outputs, request.requested_outputs())
        return InferResponse(entry.name, entry.version, message.id, selected, {RELEASE_PARAMETER: entry.release or ""})

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for row in self.service.index(ready_only=request.ready):
            response.models.add(**row)
        return response

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        async def call() -> pb.RepositoryModelLoadResponse:
            await self.service.load(request.model_name)
            return pb.RepositoryModelLoadResponse()

        return await self._answer(context, call)

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        async def call() -> pb.RepositoryModelUnloadResponse:
            await self.service.unload(request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await self._answer(context, call)


def _timeout(context: Any, parameters: dict[str, Any]) -> float | None:
    """The call's gRPC deadline, or Triton's ``timeout`` parameter (microseconds), whichever is sooner."""
    remaining = context.time_remaining()
    given = parameters.get("timeout")
    candidates = [t for t in (remaining, given / 1e6 if isinstance(given, int) and given > 0 else None) if t]
    return min(candidates) if candidates else None


class GrpcServerHandle(Protocol):
    """A started gRPC server, whichever engine runs it."""

    async def stop(self, grace: float | None) -> None: ...


async def start_grpc_server(
    service: ModelService, host: str, port: int, *, engine: GrpcEngine = "native"
) -> GrpcServerHandle:
    """Bind and start the gRPC server (messages up to 1 GiB). Raises OSError if the port is taken.

    ``native`` (the default) serves on the event loop (``grpc_server.py``); ``grpcio`` uses ``grpc.aio``'s server,
    whose threads cost a single-core inference server 10-15% of its throughput (docs/benchmarks/split.md).
    """
    servicer = GrpcInferenceServicer(service)
    if engine == "native":
        methods = {
            f"/{SERVICE}/{name}": UnaryMethod(
                getattr(servicer, name), *server_codec(name), enforces_deadline=name == "ModelInfer"
            )
            for name in METHODS
        }
        native = GrpcServer(methods, limits=Http2Limits(max_body_bytes=MAX_MESSAGE_BYTES + 5))
        servicer.calls_in_progress = lambda: native.open_calls
        await native.start(host, port)
        return native
    if engine != "grpcio":
        raise ValueError(f"grpc engine must be 'native' or 'grpcio', got {engine!r}")
    server = grpc.aio.server(options=[*MESSAGE_OPTIONS, ("grpc.so_reuseport", 0)])
    add_servicer(server, servicer)
    address = f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio raises on a failed bind (older versions returned 0)
        raise OSError(f"cannot bind gRPC to {address}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot bind gRPC to {address}")
    await server.start()
    return server
