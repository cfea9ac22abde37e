"""Grouping concurrent requests into batches for a model."""

from pipeserve.batching.batcher import Batcher
from pipeserve.batching.lane import CpuLane
from pipeserve.batching.policy import BatchPolicy

__all__ = ["BatchPolicy", "Batcher", "CpuLane"]
