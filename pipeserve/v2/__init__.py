"""The Open Inference Protocol (KServe v2), transport-neutral: datatypes, tensor codecs, the gRPC messages.

The server side lives in ``pipeserve.server.v2``, the client side in ``pipeserve.remote``; both encode and
decode tensors here, so what one writes the other reads.
"""

from pipeserve.v2.datatypes import DATATYPES, datatype_of, numpy_of

__all__ = ["DATATYPES", "datatype_of", "numpy_of"]
