"""A release: the fingerprint over everything that must stay in step, and the golden check."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeserve.errors import GoldenCheckFailed
from pipeserve.pipeline.loader import LoadedSpec


def fingerprint(loaded: LoadedSpec) -> str:
    """SHA-256 (first 16 hex digits) over the spec, handler sources, artifacts, labels, sample and golden.

    Two deployments with the same fingerprint run the same preprocessing code and config with the same
    model bytes; any edit to any of them changes it.
    """
    digest = hashlib.sha256()
    digest.update(loaded.path.read_bytes())
    for path in sorted(release_files(loaded)):
        digest.update(str(path.relative_to(loaded.base_dir) if path.is_relative_to(loaded.base_dir) else path).encode())
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def release_files(loaded: LoadedSpec) -> set[Path]:
    """The files, besides the spec, whose bytes belong to the release."""
    spec = loaded.spec
    files: set[Path] = set()
    for node in spec.nodes:
        meta = node.model_load_meta
        if meta is None:
            continue
        if meta.artifact:
            artifact = loaded.resolve(meta.artifact)
            files.update(p for p in ([artifact] if artifact.is_file() else sorted(artifact.rglob("*"))) if p.is_file())
    # All Python source in the spec folder: the handler modules and whatever helpers they import.
    files.update(p for p in loaded.base_dir.rglob("*.py") if "__pycache__" not in p.parts)
    for name in (
        spec.labels if isinstance(spec.labels, str) else None,
        spec.sample.file if spec.sample else None,
        spec.golden.prediction_file if spec.golden else None,
    ):
        if name:
            files.add(loaded.resolve(name))
    return files


def golden_prediction(loaded: LoadedSpec) -> Any:
    """The expected ``/predict`` output for the sample, or ``None`` when the spec gives none."""
    golden = loaded.spec.golden
    if golden is None:
        return None
    if golden.prediction_file is not None:
        return json.loads(loaded.resolve(golden.prediction_file).read_text(encoding="utf-8"))
    return golden.prediction


def check_golden(loaded: LoadedSpec, prediction: Any, label: Any) -> str:
    """Compare the sample's prediction (and label) with the golden ones; return a one-line summary.

    Raises:
        GoldenCheckFailed: a mismatch, with the largest difference and where it is.
    """
    golden = loaded.spec.golden
    if golden is None:
        return "no golden output configured"
    parts = []
    expected = golden_prediction(loaded)
    if expected is not None:
        _compare(expected, prediction, atol=golden.atol, rtol=golden.rtol)
        parts.append("prediction matches")
    if golden.label is not None:
        if label != golden.label:
            raise GoldenCheckFailed(f"golden label is {golden.label!r} but the sample gives {label!r}")
        parts.append(f"label {label!r}")
    return ", ".join(parts) or "nothing to compare"


def _compare(expected: Any, actual: Any, *, atol: float, rtol: float) -> None:
    try:
        want = np.asarray(expected, dtype=np.float64)
        got = np.asarray(actual, dtype=np.float64)
    except (TypeError, ValueError):
        if _plain(expected) != _plain(actual):
            raise GoldenCheckFailed(f"golden prediction {expected!r} differs from the sample's {actual!r}") from None
        return
    if want.shape != got.shape:
        raise GoldenCheckFailed(f"golden prediction has shape {want.shape} but the sample gives {got.shape}")
    if not np.allclose(got, want, atol=atol, rtol=rtol):
        diff = np.abs(got - want)
        where = np.unravel_index(int(diff.argmax()), diff.shape)
        raise GoldenCheckFailed(
            f"sample prediction differs from golden by up to {float(diff.max()):.3g} at index {list(map(int, where))} "
            f"(golden {float(want[where]):.6g}, got {float(got[where]):.6g}; atol={atol}, rtol={rtol})"
        )


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
