"""Asynchronous jobs: submit -> queue -> workers -> result, on Redis Streams or in-process."""

from pipeserve.jobs.model import JobRecord, JobRequest, check_job_id
from pipeserve.jobs.queue import Delivery, JobQueue, MemoryJobQueue, NotificationClaim
from pipeserve.jobs.redis_queue import RedisJobQueue
from pipeserve.jobs.webhook import WebhookSender
from pipeserve.jobs.worker import JobWorker, WorkerOptions

__all__ = [
    "Delivery",
    "JobQueue",
    "JobRecord",
    "JobRequest",
    "JobWorker",
    "MemoryJobQueue",
    "NotificationClaim",
    "RedisJobQueue",
    "WebhookSender",
    "WorkerOptions",
    "check_job_id",
]
