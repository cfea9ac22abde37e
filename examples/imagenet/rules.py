"""Business logic on top of the classifier: is the picture an animal?

ImageNet-1k's classes 0-397 are animals (tench ... puffer); 398-999 are objects, food and scenes. A picture is
an animal when the animal classes hold most of the probability, whatever the single best class is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ANIMAL_CLASSES = 398


class AnimalOrNot:
    """Takes ``{"probs": [N, 1000] softmax, "top": top-k per row}``; answers one verdict per row."""

    def predict(self, parts: dict[str, Any]) -> list[dict[str, Any]]:
        probs = np.atleast_2d(np.asarray(parts["probs"], dtype=np.float64))
        animal = probs[:, :ANIMAL_CLASSES].sum(axis=1)
        return [
            {"animal": bool(p >= 0.5), "animal_prob": round(float(p), 6), "best": top[0]["name"]}
            for p, top in zip(animal, parts["top"], strict=True)
        ]
