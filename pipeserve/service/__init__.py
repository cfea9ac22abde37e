"""The transport-neutral core: load a pipeline, keep it healthy, answer predictions."""

from pipeserve.service.inference import InferenceService, ServiceState

__all__ = ["InferenceService", "ServiceState"]
