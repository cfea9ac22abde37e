"""A seed-style web-single app: one FastAPI file, the model loaded at import, ONNX Runtime per request.

Like the seed services: a pydantic `Data` model, sync `def` endpoints (FastAPI runs them in its thread pool).
Run: BENCH_MODEL=iris uvicorn bench.apps.seed_app:app
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from bench.apps.common import MODEL, Predictor

predictor = Predictor()  # the seed loads its model at import, as module-level state
app = FastAPI(title="seed-style web single")


class Data(BaseModel):
    data: Any = [[5.1, 3.5, 1.4, 0.2]] if MODEL == "iris" else ""


@app.get("/health")
def health() -> dict[str, str]:
    return {"health": "ok"}


@app.post("/predict/label")
def predict_label(data: Data) -> dict[str, str]:
    return {"prediction": predictor.label(data.data)}
