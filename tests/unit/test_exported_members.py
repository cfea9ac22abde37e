"""The public surface: ``pipeserve.__all__`` is exactly what the package exports, and importing it is light."""

from __future__ import annotations

import subprocess
import sys
import types

import pipeserve

HEAVY = ("onnxruntime", "torch", "sklearn", "PIL", "fastapi")


def public_members() -> set[str]:
    return {
        name
        for name, value in vars(pipeserve).items()
        if (not name.startswith("_") or name == "__version__") and not isinstance(value, types.ModuleType)
    }


def test_all_lists_every_public_member():
    assert set(pipeserve.__all__) == public_members()


def test_all_has_no_duplicates_and_is_sorted():
    assert len(pipeserve.__all__) == len(set(pipeserve.__all__))
    assert pipeserve.__all__ == sorted(pipeserve.__all__)


def test_every_name_in_all_resolves():
    for name in pipeserve.__all__:
        assert getattr(pipeserve, name) is not None, name


def test_exported_classes_say_they_live_in_pipeserve():
    for name in pipeserve.__all__:
        value = getattr(pipeserve, name)
        if isinstance(value, type):
            assert value.__module__.startswith("pipeserve."), name


def test_importing_pipeserve_does_not_import_heavy_libraries():
    code = (
        "import sys, pipeserve\n"
        f"loaded = [name for name in {HEAVY!r} if name in sys.modules]\n"
        "print(','.join(loaded))\n"
    )

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=30)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
