"""Build the iris example: an SVC trained on scikit-learn's iris data, converted to ONNX.

Writes models/iris.onnx and golden.json (scikit-learn's own probabilities for the sample, so the golden
check proves the ONNX conversion and the serving path agree with the reference model), and models/iris.joblib
(the fitted scikit-learn model itself, which peer servers such as MLServer's sklearn runtime serve).

    python examples/iris/build_iris.py
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SAMPLE = [[5.1, 3.5, 1.4, 0.2]]


def build(out_dir: Path = HERE) -> Path:
    import joblib
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.datasets import load_iris
    from sklearn.svm import SVC

    features, target = load_iris(return_X_y=True)
    # CalibratedClassifierCV(SVC(), ensemble=False) is scikit-learn's replacement for SVC(probability=True).
    model = CalibratedClassifierCV(SVC(random_state=0), ensemble=False).fit(features, target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # skl2onnx reads SVC attributes sklearn 1.9 deprecates
        onnx_model = convert_sklearn(
            model,
            initial_types=[("input", FloatTensorType([None, 4]))],
            options={id(model): {"zipmap": False}},
            target_opset=17,
        )
    models = out_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    artifact = models / "iris.onnx"
    artifact.write_bytes(onnx_model.SerializeToString())
    joblib.dump(model, models / "iris.joblib")
    reference = model.predict_proba(np.asarray(SAMPLE, dtype=np.float32))[0]
    (out_dir / "golden.json").write_text(json.dumps([round(float(p), 7) for p in reference]) + "\n")
    print(f"wrote {artifact} ({artifact.stat().st_size} bytes); sample probabilities {reference.round(4).tolist()}")
    return artifact


if __name__ == "__main__":
    build()
