"""Stopping tasks for sure (shared/tasks.py): Python 3.11's ``asyncio.wait_for`` can take a cancel
for a result, and a loop that only ends on its CancelledError then runs on."""

from __future__ import annotations

import asyncio
import sys

import pytest

from shared.tasks import cancel_until_done


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
    # Until the loop has settled the cancel one way or the other (ended, or waits for its next
    # reply): counted in turns of the event loop, not in seconds, so a slow machine changes nothing.
    for _ in range(1000):
        if task.done() or len(replies) > 1:
            break
        await asyncio.sleep(0)


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
    await asyncio.wait_for(cancel_until_done([task], every_s=0.05), timeout=60)  # hang guard
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
