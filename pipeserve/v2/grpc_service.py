"""The ``inference.GRPCInferenceService`` wiring: method paths and (de)serializers, for servers and clients.

Registered by hand (no generated ``_pb2_grpc``): our messages live in a package of their own so they never
clash with tritonclient's in one process, while the service keeps its protocol name on the wire.
"""

from __future__ import annotations

from typing import Any

import grpc

from pipeserve.v2 import infer_proto
from pipeserve.v2._proto import inference_pb2 as pb

SERVICE = "inference.GRPCInferenceService"

#: RPC name -> (request message, response message).
METHODS: dict[str, tuple[Any, Any]] = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
    "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
}

#: How a server reads an RPC's request and writes its answer where protobuf's own objects would cost: ModelInfer's
#: tensors stay views of the bytes on the wire (``infer_proto``). Its handler takes an ``InferRequest`` and returns an
#: ``InferResponse``.
SERVER_CODECS: dict[str, tuple[Any, Any]] = {
    "ModelInfer": (infer_proto.decode_request, infer_proto.encode_response),
}


def server_codec(name: str) -> tuple[Any, Any]:
    """(request deserializer, response serializer) of RPC ``name`` on a server."""
    request, response = METHODS[name]
    return SERVER_CODECS.get(name, (request.FromString, response.SerializeToString))


#: Real tensors are far above gRPC's 4 MiB default; Triton's HTTP limit is 64 MiB, tritonclient's channel INT32_MAX.
MAX_MESSAGE_BYTES = 1 << 30
MESSAGE_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def add_servicer(server: Any, servicer: Any) -> None:
    """Register ``servicer``'s methods (named as the RPCs) on a grpc (aio) server."""
    handlers = {}
    for name in METHODS:
        deserialize, serialize = server_codec(name)
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name), request_deserializer=deserialize, response_serializer=serialize
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


class Stub:
    """Client callables, one per RPC (``stub.ModelInfer(request, timeout=...)``), on a grpc (aio) channel."""

    def __init__(self, channel: Any) -> None:
        for name, (request, response) in METHODS.items():
            setattr(
                self,
                name,
                channel.unary_unary(
                    f"/{SERVICE}/{name}",
                    request_serializer=request.SerializeToString,
                    response_deserializer=response.FromString,
                ),
            )

    def __getattr__(self, name: str) -> Any:  # for type checkers: attributes are set per RPC above
        raise AttributeError(name)
