"""The inference server's transports: v2 over HTTP (with the binary tensor extension) and over gRPC."""

from pipeserve.server.v2.grpc import GrpcInferenceServicer, start_grpc_server
from pipeserve.server.v2.http import V2HttpApp

__all__ = ["GrpcInferenceServicer", "V2HttpApp", "start_grpc_server"]
