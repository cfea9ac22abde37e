"""The work every comparison app does, written once so that each does exactly the same thing.

Environment: BENCH_MODEL (iris | imagenet), BENCH_SPEC_DIR (the example folder with its built artifacts).
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

MODEL = os.environ.get("BENCH_MODEL", "iris")
SPEC_DIR = Path(os.environ.get("BENCH_SPEC_DIR", Path(__file__).resolve().parents[2] / "examples" / MODEL))
IRIS_LABELS = ["setosa", "versicolor", "virginica"]


def session() -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    artifact = SPEC_DIR / "models" / ("iris.onnx" if MODEL == "iris" else "efficientnet_lite0.onnx")
    return ort.InferenceSession(str(artifact), options, providers=["CPUExecutionProvider"])


def labels() -> list[str]:
    if MODEL == "iris":
        return IRIS_LABELS
    return (SPEC_DIR / "labels.txt").read_text().splitlines()


def preprocess_image(encoded: str) -> np.ndarray[Any, Any]:
    """base64 JPEG -> NCHW uint8 pixels (the model normalizes them: DESIGN.md's (x - 127) / 128 in its graph)."""
    return preprocess_bytes(base64.b64decode(encoded))


def preprocess_bytes(encoded: bytes) -> np.ndarray[Any, Any]:
    """JPEG bytes -> NCHW uint8: RGB, short side 256 (bicubic), centre crop 224; the model does (x - 127) / 128."""
    from PIL import Image

    image = Image.open(io.BytesIO(encoded)).convert("RGB")
    width, height = image.size
    scale = 256 / min(width, height)
    image = image.resize((round(width * scale), round(height * scale)), Image.Resampling.BICUBIC)
    width, height = image.size
    left, top = (width - 224) // 2, (height - 224) // 2
    image = image.crop((left, top, left + 224, top + 224))
    return np.ascontiguousarray(np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)[None])


class Predictor:
    """data (as in {"data": ...}) -> label, the same work in every comparison app."""

    def __init__(self) -> None:
        self.session = session()
        self.input_name = self.session.get_inputs()[0].name
        self.labels = labels()

    def label(self, data: Any) -> str:
        if MODEL == "iris":
            probabilities = self.session.run(["probabilities"], {self.input_name: np.asarray(data, dtype=np.float32)})[
                0
            ]
            return self.labels[int(probabilities[0].argmax())]
        logits = self.session.run(None, {self.input_name: preprocess_image(data)})[0][0]
        exp = np.exp(logits - logits.max())
        return self.labels[int((exp / exp.sum()).argmax())]


def record_batch(size: int) -> None:
    """Append a batch's size to $BENCH_BATCH_LOG, so the runner can report the mean batch size of peers."""
    path = os.environ.get("BENCH_BATCH_LOG")
    if path:
        with open(path, "a", encoding="ascii") as log:
            log.write(f"{size}\n")


def labels_of(logits: np.ndarray[Any, Any], names: list[str]) -> list[str]:
    """The best class of each row of logits."""
    return [names[int(i)] for i in np.asarray(logits).argmax(axis=-1)]


async def read_body(receive: Any) -> bytes:
    """An ASGI request's whole body (the bare apps: no limit, no disconnect handling)."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def respond(send: Any, body: bytes) -> None:
    """A 200 JSON answer over ASGI."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
