"""Clients of v2 inference servers: the preprocessing server's side of the split."""

from pipeserve.remote.clients import EndpointDown, GrpcClient, HttpClient, RemoteError, create_client
from pipeserve.remote.pool import ReleaseMismatch, RemoteModels

__all__ = [
    "EndpointDown",
    "GrpcClient",
    "HttpClient",
    "ReleaseMismatch",
    "RemoteError",
    "RemoteModels",
    "create_client",
]
