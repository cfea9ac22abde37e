"""scikit-learn estimators saved with joblib."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pipeserve.errors import SpecError
from pipeserve.runtimes.base import Runtime
from pipeserve.types import Signature, TensorDict, TensorSpec


class SklearnRuntime(Runtime):
    """Runs a joblib-pickled estimator.

    Input ``input`` (float, ``[-1, n_features_in_]``). Outputs ``label`` (``predict``) and, when the
    estimator has ``predict_proba``, ``probabilities``. Only load pickles you trust: unpickling runs code.
    """

    name: ClassVar[str] = "sklearn"
    # scikit-learn holds the GIL for much of its work; threads still keep the event loop free.
    releases_gil: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._model: Any = None
        self._has_proba = False

    def load(self) -> None:
        try:
            import joblib
        except ImportError as exc:
            raise SpecError("runtime 'sklearn' needs scikit-learn: pip install 'pipeserve[sklearn]'") from exc
        path = self.options.artifact
        if path is None:
            raise SpecError("runtime 'sklearn' needs an artifact path", field="artifact")
        try:
            model = joblib.load(path)
        except Exception as exc:
            raise SpecError(
                f"cannot load scikit-learn model {path}: {type(exc).__name__}: {exc}", field="artifact"
            ) from exc
        if not hasattr(model, "predict"):
            raise SpecError(f"{path} holds a {type(model).__name__}, which has no predict()", field="artifact")
        self._model = model
        self._has_proba = hasattr(model, "predict_proba")
        n_features = int(getattr(model, "n_features_in_", -1))
        outputs = [TensorSpec("label", _label_dtype(model), (-1,))]
        if self._has_proba:
            n_classes = len(getattr(model, "classes_", [])) or -1
            outputs.append(TensorSpec("probabilities", "float32", (-1, n_classes)))
        self._signature = Signature(inputs=(TensorSpec("input", "float32", (-1, n_features)),), outputs=tuple(outputs))

    def predict(self, inputs: TensorDict) -> TensorDict:
        x = inputs["input"]
        result: TensorDict = {"label": np.asarray(self._model.predict(x))}
        if self._has_proba:
            result["probabilities"] = np.asarray(self._model.predict_proba(x), dtype=np.float32)
        return result

    def unload(self) -> None:
        self._model = None


def _label_dtype(model: Any) -> str:
    classes = getattr(model, "classes_", None)
    return np.asarray(classes).dtype.name if classes is not None else "int64"
