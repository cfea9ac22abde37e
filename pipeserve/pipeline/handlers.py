"""User handlers: Python code named by ``model_load_meta.handler_module``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeserve._importer import ImportFromStringError, import_handler_module
from pipeserve.errors import SpecError


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """Handed to ``Handler.load``: the node's name, its ``params`` from the spec, the spec's folder, labels."""

    node: str
    base_dir: Path
    params: dict[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] | None = None


class Handler:
    """Base class for a pipeline step written in Python.

    Override ``predict`` (sync or ``async def``); override ``load`` to prepare state once, before serving.
    Sync handlers run in a worker thread, so they may block; async ones run on the event loop.

    Example:
        >>> class Upper(Handler):
        ...     def predict(self, data):
        ...         return data.upper()
        >>> Upper().predict("cat")
        'CAT'
    """

    def load(self, context: HandlerContext) -> None:
        """Called once, off the event loop, before the first request."""

    def predict(self, data: Any) -> Any:
        """Turn this node's input into its output."""
        raise NotImplementedError(f"{type(self).__name__} must implement predict(data)")


HandlerFactory = Callable[[], Any]


def resolve_handler(target: str, base_dir: Path, *, file: str | None, node: str) -> HandlerFactory:
    """Import ``target`` (``module`` or ``module:attr``) and return a factory for the handler object.

    In a module without ``:attr``, the handler is, in order: a ``handler`` attribute; the one class defined
    there that subclasses ``Handler`` or has a ``predict`` method; a module-level ``predict`` function.

    Raises:
        SpecError: the module cannot be imported, or no (or more than one) handler is found in it.
    """
    module_name, _, attr = target.partition(":")
    try:
        module = import_handler_module(module_name, base_dir)
    except ImportFromStringError as exc:
        raise SpecError(
            f"unimportable handler: {exc}", file=file, node=node, field="model_load_meta.handler_module"
        ) from exc
    where = getattr(module, "__file__", module_name)
    if attr:
        if not hasattr(module, attr):
            raise SpecError(
                f"{where} has no attribute {attr!r}", file=file, node=node, field="model_load_meta.handler_module"
            )
        return _factory(getattr(module, attr), file=file, node=node)
    if hasattr(module, "handler"):
        return _factory(module.handler, file=file, node=node)
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and obj.__module__ == module.__name__
        and (issubclass(obj, Handler) or callable(getattr(obj, "predict", None)))
    ]
    if len(classes) == 1:
        return _factory(classes[0], file=file, node=node)
    if len(classes) > 1:
        names = ", ".join(c.__name__ for c in classes)
        raise SpecError(
            f"{where} defines several handler classes ({names}); name one as '{module_name}:ClassName'",
            file=file,
            node=node,
            field="model_load_meta.handler_module",
        )
    if callable(getattr(module, "predict", None)):
        return _factory(module.predict, file=file, node=node)
    raise SpecError(
        f"{where} defines no handler: expected a pipeserve.Handler subclass, a class with predict(data), "
        "a `handler` object or a predict(data) function",
        file=file,
        node=node,
        field="model_load_meta.handler_module",
    )


def _factory(obj: Any, *, file: str | None, node: str) -> HandlerFactory:
    if inspect.isclass(obj):
        if not callable(getattr(obj, "predict", None)):
            raise SpecError(
                f"class {obj.__name__} has no predict(data) method",
                file=file,
                node=node,
                field="model_load_meta.handler_module",
            )
        return obj
    if callable(getattr(obj, "predict", None)):
        return lambda: obj
    if callable(obj):
        return lambda: _FunctionHandler(obj)
    raise SpecError(
        f"{obj!r} is neither a class, an object with predict(), nor a function",
        file=file,
        node=node,
        field="model_load_meta.handler_module",
    )


class _FunctionHandler:
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.predict = fn
