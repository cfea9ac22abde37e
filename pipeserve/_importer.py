"""Resolve the Python objects a spec names: ``package.module:attr`` strings and handler modules by path."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


class ImportFromStringError(ImportError):
    """The named module or attribute could not be imported; the message says which and why."""


def import_from_string(target: str) -> Any:
    """Import ``"package.module:attr"`` (or ``"package.module.attr"``) and return the attribute.

    Example:
        >>> import_from_string("json:dumps").__name__
        'dumps'
    """
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ImportFromStringError(f"{target!r} is not an import string; expected 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportFromStringError(f"cannot import module {module_name!r} for {target!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ImportFromStringError(f"module {module_name!r} has no attribute {attr!r}") from exc


def import_handler_module(dotted: str, base_dir: Path) -> ModuleType:
    """Import a handler module named relative to a spec directory, else from the installed packages.

    ``m1.dummy_python_model`` loads ``<base_dir>/m1/dummy_python_model.py`` (or ``.../__init__.py`` of a
    package) under a module name unique to ``base_dir``, so two pipelines that both have an ``m1`` folder
    never share a module. A name that is not a file under ``base_dir`` is imported normally.

    Raises:
        ImportFromStringError: the module is neither a file under ``base_dir`` nor importable, or it raised.
    """
    parts = dotted.split(".")
    if not all(part.isidentifier() for part in parts):
        raise ImportFromStringError(f"{dotted!r} is not a dotted module name; expected e.g. 'm1.dummy_python_model'")
    candidates = [base_dir.joinpath(*parts).with_suffix(".py"), base_dir.joinpath(*parts, "__init__.py")]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        try:
            return importlib.import_module(dotted)
        except ImportError as exc:
            looked = ", ".join(str(c) for c in candidates)
            raise ImportFromStringError(
                f"handler module {dotted!r} not found: no file at {looked} and not importable ({exc})"
            ) from exc
    digest = hashlib.sha1(str(base_dir.resolve()).encode()).hexdigest()[:10]
    module_name = f"_pipeserve_handlers_{digest}.{dotted}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportFromStringError(f"cannot load handler module {dotted!r} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ImportFromStringError(f"handler module {dotted!r} ({path}) raised {type(exc).__name__}: {exc}") from exc
    return module
