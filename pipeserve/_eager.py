"""Coroutines run up to their first wait at once, a task made only for the rest (Python 3.12's eager tasks).

A request that an inference server answers without waiting (a model alone on the event loop) then needs no task,
no trip round the event loop and no future callbacks: on the cold path right after a model run those cost
~130 us of what the network hop adds (docs/split.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import time
import types
from collections.abc import Coroutine, Generator
from typing import Any


class _Slot:
    """Where ``start`` puts the task it makes for the rest of a coroutine it began."""

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None


_slot: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("pipeserve_eager_slot", default=None)


def start(coroutine: Coroutine[Any, Any, None], *, name: str | None = None) -> asyncio.Task[None] | None:
    """Run ``coroutine`` now, in a copy of the current context (as a task would), up to its first wait; the task
    that finishes it, or ``None`` when it finished at once. An exception it raises before its first wait
    propagates here; later ones end the task."""
    if asyncio.current_task() is not None:  # resume_within would take that task for the one start makes
        raise RuntimeError("_eager.start runs outside tasks (in a protocol's callbacks); in a task, await instead")
    context = contextvars.copy_context()
    slot = _Slot()
    context.run(_slot.set, slot)
    try:
        waiting_on = context.run(coroutine.send, None)
    except StopIteration:
        return None
    task = asyncio.get_running_loop().create_task(_finish(coroutine, waiting_on), name=name, context=context)
    slot.task = task
    task.add_done_callback(functools.partial(_abandoned, coroutine, waiting_on))
    return task


def _abandoned(coroutine: Coroutine[Any, Any, Any], waiting_on: Any, task: asyncio.Task[Any]) -> None:
    """A task cancelled before its first step never resumes the coroutine: close it (its ``finally`` blocks run)
    and cancel what it waited on."""
    if inspect.getcoroutinestate(coroutine) != inspect.CORO_SUSPENDED:
        return
    if isinstance(waiting_on, asyncio.Future):
        waiting_on.cancel()
    coroutine.close()


async def _finish(coroutine: Coroutine[Any, Any, Any], waiting_on: Any) -> Any:
    return await resume(coroutine, waiting_on)


@types.coroutine
def resume(coroutine: Coroutine[Any, Any, Any], waiting_on: Any) -> Generator[Any, Any, Any]:
    """Await the rest of ``coroutine``, which has run up to a wait and handed out ``waiting_on`` (what a task
    waits on: a future, or None to yield once): the task waits on it, then resumes the coroutine where it was."""
    while True:
        try:
            yield waiting_on
        except BaseException as exc:  # noqa: BLE001 - cancelled (or thrown into) while waiting: the coroutine decides
            try:
                waiting_on = coroutine.throw(exc)
            except StopIteration as finished:
                return finished.value
            continue
        return (yield from coroutine)


async def run_within(coroutine: Coroutine[Any, Any, Any], deadline_s: float) -> Any:
    """Await ``coroutine``, cancelled at ``deadline_s`` (``time.monotonic()``) with ``TimeoutError``; the timer
    is armed only if it waits (what runs start to finish on the event loop cannot be interrupted anyway)."""
    try:
        _owner_or_raise()
    except RuntimeError:
        coroutine.close()  # never begun
        raise
    try:
        waiting_on = coroutine.send(None)
    except StopIteration as finished:
        return finished.value
    return await resume_within(coroutine, waiting_on, deadline_s)


async def resume_within(coroutine: Coroutine[Any, Any, Any], waiting_on: Any, deadline_s: float) -> Any:
    """``resume``, cancelled at ``deadline_s`` (``time.monotonic()``) with ``TimeoutError``, like
    ``asyncio.timeout_at``; also where no task runs yet, inside ``start``'s first step (the timer cancels the task
    that ``start`` makes)."""
    task, slot = _owner_or_raise()
    cancelling = task.cancelling() if task is not None else 0
    expired = False

    def owner() -> asyncio.Task[Any] | None:  # start's task exists once its first step has returned
        return task if task is not None else slot.task if slot is not None else None

    def expire() -> None:
        nonlocal expired
        target = owner()
        if target is not None and not target.done():
            expired = True
            target.cancel()

    loop = asyncio.get_running_loop()
    timer = loop.call_at(loop.time() + deadline_s - time.monotonic(), expire)
    uncancelled = False
    try:
        return await resume(coroutine, waiting_on)
    except asyncio.CancelledError:
        target = owner()
        if expired and target is not None:
            uncancelled = True
            if target.uncancel() <= cancelling:
                raise TimeoutError from None
        raise
    finally:
        timer.cancel()
        target = owner()
        if expired and not uncancelled and target is not None:  # the work swallowed the cancel: undo it, as
            target.uncancel()  # asyncio.timeout does


def _owner_or_raise() -> tuple[asyncio.Task[Any] | None, _Slot | None]:
    """The task a deadline cancels, or the slot of the one ``start`` is about to make."""
    task = asyncio.current_task()
    slot = _slot.get() if task is None else None
    if task is None and slot is None:
        raise RuntimeError("a deadline needs a task, or a coroutine begun by _eager.start")
    return task, slot
