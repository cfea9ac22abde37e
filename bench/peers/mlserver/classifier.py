"""MLServer serving the imagenet ONNX model with the same preprocessing, with MLServer's adaptive batching.

A custom MLModel: BYTES input "image" (base64 JPEG, one per row), BYTES output "label". Batching is
configured in model-settings.json (max_batch_size, max_batch_time), written by the benchmark runner.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mlserver import MLModel
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

from bench.apps.common import labels, labels_of, preprocess_image, record_batch, session


class Classifier(MLModel):  # type: ignore[misc]
    async def load(self) -> bool:
        self.session = session()
        self.input_name = self.session.get_inputs()[0].name
        self.names = labels()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        images = [item.decode() if isinstance(item, bytes) else item for item in payload.inputs[0].data.root]
        record_batch(len(images))
        batch: Any = np.concatenate([preprocess_image(image) for image in images])
        names = labels_of(self.session.run(None, {self.input_name: batch})[0], self.names)
        return InferenceResponse(
            model_name=self.name,
            outputs=[ResponseOutput(name="label", datatype="BYTES", shape=[len(names)], data=names)],
        )
