"""Stopping tasks for sure (shared/tasks.py): Python 3.11's ``asyncio.wait_for`` can take a cancel
for a result, and a loop that only ends on its CancelledError then runs on; and ``together``, gather
without a task for the first awaitable."""

from __future__ import annotations

import asyncio
import sys

import pytest

from shared.tasks import cancel_until_done, together


def _replier_loop(replies: list[asyncio.Future[int]]) -> asyncio.Task[None]:
    """A loop that waits for one reply after another with wait_for, as a nats-py fetch loop does."""

    async def loop() -> None:
        while True:
            reply: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            replies.append(reply)
            await asyncio.wait_for(reply, timeout=60)

    return asyncio.create_task(loop())


async def _cancel_as_the_reply_lands(task: asyncio.Task[None], replies: list[asyncio.Future[int]]) -> None:
    await asyncio.sleep(0)  # the loop now waits for its first reply
    replies[-1].set_result(1)
    task.cancel()
    await asyncio.sleep(0.05)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 fixed wait_for: a cancel is never lost there")
async def test_on_this_python_one_cancel_can_be_taken_for_a_reply() -> None:
    """Why cancel_until_done exists: the race is real on the Python that ftbus runs."""
    replies: list[asyncio.Future[int]] = []
    task = _replier_loop(replies)
    await _cancel_as_the_reply_lands(task, replies)
    try:
        assert not task.done(), "the cancel was not lost: this Python's wait_for no longer needs the guard"
        assert len(replies) == 2, "the loop went on to wait for its next reply"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_loop_that_took_its_cancel_for_a_reply_is_still_stopped() -> None:
    replies: list[asyncio.Future[int]] = []
    task = _replier_loop(replies)
    await _cancel_as_the_reply_lands(task, replies)
    await asyncio.wait_for(cancel_until_done([task], every_s=0.05), timeout=10)
    assert task.done() and task.cancelled()


async def test_tasks_that_end_on_their_own_keep_their_results() -> None:
    async def answer() -> int:
        return 42

    async def fail() -> None:
        raise ValueError("broken")

    done, failed = asyncio.create_task(answer()), asyncio.create_task(fail())
    await asyncio.sleep(0)
    await cancel_until_done([done, failed])
    assert done.result() == 42
    with pytest.raises(ValueError, match="broken"):
        failed.result()


async def test_together_runs_every_awaitable_at_once_and_makes_no_task_for_a_lone_one() -> None:
    """``together`` is gather for the hot path: the same results, concurrency and errors, with one
    task fewer (none for a single awaitable)."""
    order: list[str] = []

    async def step(name: str, wait_s: float, fail: bool = False) -> str:
        order.append(f"{name} starts")
        await asyncio.sleep(wait_s)
        order.append(f"{name} ends")
        if fail:
            raise ValueError(name)
        return name

    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await together(step("a", 0.2), step("b", 0.2), step("c", 0.2)) == ["a", "b", "c"]
    assert loop.time() - began < 0.55, "they ran one after the other"
    assert await together() == []

    here = asyncio.current_task()
    made: list[object] = []
    real_ensure_future = asyncio.ensure_future
    asyncio.ensure_future = lambda aw, **kw: made.append(aw) or real_ensure_future(aw, **kw)  # type: ignore[assignment]
    try:
        assert await together(step("lone", 0)) == ["lone"]
    finally:
        asyncio.ensure_future = real_ensure_future  # type: ignore[assignment]
    assert made == [] and asyncio.current_task() is here

    order.clear()
    with pytest.raises(ValueError, match=r"^b$"):
        await together(step("a", 0.1), step("b", 0.0, fail=True), step("c", 0.2, fail=True))
    assert "c ends" in order, "an error returned before the others were over"

    slow = asyncio.create_task(together(step("x", 5), step("y", 5)))
    await asyncio.sleep(0.1)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert "y ends" not in order and "x ends" not in order
