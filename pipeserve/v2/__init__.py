"""The Open Inference Protocol (KServe v2), transport-neutral: datatypes, tensor codecs, the gRPC messages.

The server side lives in ``pipeserve.server.v2``, the client side in ``pipeserve.remote``; both encode and
decode tensors here, so what one writes the other reads.
"""

from pipeserve.v2.datatypes import DATATYPES, datatype_of, numpy_of

#: The model parameter (in metadata and every inference response) naming the release a model belongs to: what a
#: pipeserve inference server writes and a preprocessing server or gateway checks.
RELEASE_PARAMETER = "pipeserve_release"

__all__ = ["DATATYPES", "RELEASE_PARAMETER", "datatype_of", "numpy_of"]
