"""Build the iris ensemble: the example's calibrated SVC and a logistic regression, both on scikit-learn's iris
data, each converted to ONNX; golden.json is the average of scikit-learn's own probabilities for the sample.

    python examples/iris_ensemble/build_iris_ensemble.py
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SAMPLE = [[5.1, 3.5, 1.4, 0.2]]


def _to_onnx(model: Any, path: Path) -> None:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # skl2onnx reads SVC attributes sklearn 1.9 deprecates
        onnx_model = convert_sklearn(
            model,
            initial_types=[("input", FloatTensorType([None, 4]))],
            options={id(model): {"zipmap": False}},
            target_opset=17,
        )
    path.write_bytes(onnx_model.SerializeToString())


def build(out_dir: Path = HERE) -> Path:
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC

    features, target = load_iris(return_X_y=True)
    svc = CalibratedClassifierCV(SVC(random_state=0), ensemble=False).fit(features, target)
    logreg = LogisticRegression(max_iter=1000).fit(features, target)
    models = out_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    _to_onnx(svc, models / "svc.onnx")
    _to_onnx(logreg, models / "logreg.onnx")
    sample = np.asarray(SAMPLE, dtype=np.float32)
    average = (svc.predict_proba(sample)[0] + logreg.predict_proba(sample)[0]) / 2
    (out_dir / "golden.json").write_text(json.dumps([round(float(p), 7) for p in average]) + "\n")
    print(f"wrote {models}/svc.onnx and logreg.onnx; averaged sample probabilities {average.round(4).tolist()}")
    return models / "svc.onnx"


if __name__ == "__main__":
    build()
