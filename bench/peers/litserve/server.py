"""LitServe serving the imagenet ONNX model with the same preprocessing, with LitServe's own batching.

Environment: PORT, BENCH_MAX_BATCH (1 = no batching), BENCH_BATCH_TIMEOUT_S, BENCH_SPEC_DIR, BENCH_BATCH_LOG.
"""

import os
from typing import Any

import litserve as ls
import numpy as np

from bench.apps.common import labels, labels_of, preprocess_image, record_batch, session


class ImagenetAPI(ls.LitAPI):  # type: ignore[misc]
    def setup(self, device: str) -> None:
        self.session = session()
        self.input_name = self.session.get_inputs()[0].name
        self.names = labels()

    def decode_request(self, request: dict) -> np.ndarray:  # type: ignore[type-arg]  # LitServe reads this annotation
        return preprocess_image(request["data"])

    def batch(self, inputs: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
        return np.concatenate(inputs)

    def predict(self, x: np.ndarray[Any, Any]) -> Any:
        record_batch(len(x))
        return self.session.run(None, {self.input_name: x})[0]

    def unbatch(self, output: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
        return list(output)

    def encode_response(self, logits: np.ndarray[Any, Any]) -> dict[str, str]:
        return {"prediction": labels_of(np.atleast_2d(logits), self.names)[0]}


if __name__ == "__main__":
    max_batch = int(os.environ.get("BENCH_MAX_BATCH", "8"))
    timeout = float(os.environ.get("BENCH_BATCH_TIMEOUT_S", "0.005"))
    api = ImagenetAPI(max_batch_size=max_batch, batch_timeout=timeout if max_batch > 1 else 0.0)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, timeout=120)
    server.run(host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning", generate_client_file=False)
