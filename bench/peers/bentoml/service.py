"""BentoML serving the imagenet ONNX model with the same preprocessing, with BentoML's adaptive batching.

Run: bentoml serve service:Imagenet --port PORT (from this folder, bench/ on PYTHONPATH). The batchable API
takes a list: requests send {"data": ["<base64 image>"]} and get ["<label>"].
"""

from __future__ import annotations

import os
from typing import Any

import bentoml
import numpy as np

from bench.apps.common import labels, labels_of, preprocess_image, record_batch, session

MAX_BATCH = int(os.environ.get("BENCH_MAX_BATCH", "8"))


@bentoml.service(workers=1, traffic={"timeout": 120, "max_concurrency": 1024})
class Imagenet:
    def __init__(self) -> None:
        self.session = session()
        self.input_name = self.session.get_inputs()[0].name
        self.names = labels()

    @bentoml.api(batchable=MAX_BATCH > 1, max_batch_size=MAX_BATCH, max_latency_ms=10_000)
    def predict_label(self, data: list[str]) -> list[str]:
        record_batch(len(data))
        batch: Any = np.concatenate([preprocess_image(item) for item in data])
        return labels_of(self.session.run(None, {self.input_name: batch})[0], self.names)
