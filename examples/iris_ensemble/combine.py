"""Business logic of the ensemble: average the two models' class probabilities and say how sure they agree."""

from __future__ import annotations

from typing import Any

import numpy as np


class Average:
    """Takes ``{"svc": probs, "logreg": probs}`` (rows x 3 each) and returns their mean, row by row."""

    def predict(self, parts: dict[str, Any]) -> Any:
        stacked = np.stack([np.asarray(parts[name], dtype=np.float32) for name in sorted(parts)])
        return stacked.mean(axis=0)
