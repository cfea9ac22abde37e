"""pipeserve._eager: coroutines begun at once, a task only for the rest; deadlines that work before a task exists."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Coroutine
from typing import Any, cast

import pytest

from pipeserve import _eager
from pipeserve.errors import DeadlineExceeded
from pipeserve.service.limits import Admission

var: contextvars.ContextVar[str] = contextvars.ContextVar("test_eager_var", default="outside")


async def begin(coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """``_eager.start`` where the HTTP/2 server calls it: in a callback of the event loop, outside any task."""
    loop = asyncio.get_running_loop()
    begun: asyncio.Future[asyncio.Task[None] | None] = loop.create_future()
    loop.call_soon(lambda: begun.set_result(_eager.start(coroutine)))
    return await begun


async def test_a_coroutine_that_never_waits_runs_to_the_end_at_once_without_a_task() -> None:
    ran: list[str] = []

    async def work() -> None:
        ran.append(var.get())
        var.set("inside")

    task = await begin(work())
    assert task is None
    assert ran == ["outside"]  # it ran here, seeing the caller's context ...
    assert var.get() == "outside"  # ... but in a copy of it, as a task does


async def test_a_coroutine_that_waits_is_finished_by_a_task_in_its_own_context() -> None:
    steps: list[str] = []
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def work() -> None:
        var.set("inside")
        steps.append("before")
        steps.append(await gate)
        steps.append(var.get())

    task = await begin(work())
    assert task is not None
    assert steps == ["before"]  # the first step ran at once
    gate.set_result("resumed")
    await task
    assert steps == ["before", "resumed", "inside"]
    assert var.get() == "outside"


async def test_cancelling_the_task_reaches_the_coroutine_where_it_waits() -> None:
    seen: list[str] = []

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = await begin(work())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]


async def test_a_coroutine_may_catch_a_cancellation_and_go_on() -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0)
            return "kept going"
        return "slept"

    async def outer() -> str:
        coroutine = stubborn()
        return cast(str, await _eager.resume(coroutine, coroutine.send(None)))

    task = asyncio.ensure_future(outer())
    await asyncio.sleep(0.01)
    task.cancel()
    assert await task == "kept going"


async def _waits(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "done"


async def test_resume_within_raises_timeout_at_the_deadline() -> None:
    coroutine = _waits(5)
    waiting_on = coroutine.send(None)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await _eager.resume_within(coroutine, waiting_on, time.monotonic() + 0.05)
    assert time.monotonic() - started < 1


async def test_resume_within_returns_what_finishes_in_time() -> None:
    coroutine = _waits(0.01)
    assert await _eager.resume_within(coroutine, coroutine.send(None), time.monotonic() + 5) == "done"


async def test_a_cancellation_from_outside_is_not_a_timeout() -> None:
    async def outer() -> str:
        coroutine = _waits(5)
        return cast(str, await _eager.resume_within(coroutine, coroutine.send(None), time.monotonic() + 5))

    task = asyncio.ensure_future(outer())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_deadline_armed_before_the_task_exists_still_fires() -> None:
    """An inference request begun by ``_eager.start`` arms its deadline in the first step, before its task."""
    admission = Admission(4)
    outcome: list[str] = []

    async def request() -> None:
        try:
            outcome.append(await admission.run(lambda: _waits(5), 0.05, what="the request"))
        except DeadlineExceeded as exc:
            outcome.append(str(exc))

    started = time.monotonic()
    task = await begin(request())
    assert task is not None
    await task
    assert time.monotonic() - started < 1
    assert outcome == ["the request took longer than its deadline of 50 ms"]
    assert admission.in_flight == 0


async def test_work_that_never_waits_needs_no_timer_and_keeps_its_answer() -> None:
    admission = Admission(4)

    async def at_once() -> str:
        time.sleep(0.02)  # noqa: ASYNC251 - compute on the event loop: nothing could interrupt it, no timer armed
        return "answer"

    loop = asyncio.get_running_loop()
    timers = len(loop._scheduled)  # type: ignore[attr-defined]
    assert await admission.run(at_once, 0.001, what="the request") == "answer"
    assert len(loop._scheduled) == timers  # type: ignore[attr-defined]
    assert admission.in_flight == 0


async def test_the_admission_deadline_still_cancels_work_in_a_task() -> None:
    admission = Admission(4)
    with pytest.raises(DeadlineExceeded, match="deadline of 30 ms"):
        await admission.run(lambda: _waits(5), 0.03, what="the request")
    assert admission.in_flight == 0


async def test_start_refuses_to_run_inside_a_task() -> None:
    """A deadline in the coroutine would take the calling task for the one ``start`` makes."""

    async def work() -> None:
        await asyncio.sleep(0)

    coroutine = work()
    with pytest.raises(RuntimeError, match="outside tasks"):
        _eager.start(coroutine)
    coroutine.close()


async def test_a_deadline_outside_any_task_is_refused_before_the_work_begins() -> None:
    began: list[str] = []

    async def work() -> None:
        began.append("began")
        await asyncio.sleep(0)

    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[BaseException] = loop.create_future()

    def outside_any_task() -> None:
        coroutine = _eager.run_within(work(), time.monotonic() + 5)
        try:
            coroutine.send(None)
        except RuntimeError as exc:
            outcome.set_result(exc)

    loop.call_soon(outside_any_task)
    assert "needs a task" in str(await outcome)
    assert began == []


async def test_a_task_cancelled_before_its_first_step_still_closes_the_coroutine() -> None:
    cleaned: list[str] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def work() -> None:
        try:
            await gate
        finally:
            cleaned.append("finally")

    task = await begin(work())
    assert task is not None
    task.cancel()  # before the task ever ran
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["finally"]
    assert gate.cancelled()


async def test_work_that_swallows_the_deadline_leaves_its_task_uncancelled() -> None:
    async def swallows() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "kept going"
        return "slept"

    coroutine = swallows()
    waiting_on = coroutine.send(None)
    assert await _eager.resume_within(coroutine, waiting_on, time.monotonic() + 0.02) == "kept going"
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
