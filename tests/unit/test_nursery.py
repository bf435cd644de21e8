"""pymq's context managers built on a nursery let the body's own error out as itself
(pymq/common/nursery.py): ``except MQClientError`` around ``create_topic`` or
``async with Producer(...)`` catches what it names, while a failed background task still
surfaces as Trio's group."""

from __future__ import annotations

import pytest
import trio

from pymq.client import Producer, topics
from pymq.common.nursery import open_nursery_unwrapped
from pymq.remoting.errors import RemotingConnectError
from tests.helpers import free_port


class Refused(Exception):
    pass


async def test_the_bodys_error_comes_out_as_itself_with_its_cause() -> None:
    cause = OSError("the cause")
    with pytest.raises(Refused) as info:
        async with open_nursery_unwrapped() as nursery:
            nursery.start_soon(trio.sleep_forever)
            raise Refused("body") from cause
    assert info.value.__cause__ is cause
    assert not isinstance(info.value.__context__, BaseExceptionGroup)


async def test_a_failed_background_task_stays_a_group() -> None:
    async def fail() -> None:
        raise Refused("task")

    with pytest.raises(BaseExceptionGroup) as info:
        async with open_nursery_unwrapped() as nursery:
            nursery.start_soon(fail)
            await trio.sleep_forever()
    assert [type(e) for e in info.value.exceptions] == [Refused]


async def test_a_task_failing_beside_the_bodys_error_keeps_both() -> None:
    async def fail(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        with trio.CancelScope(shield=True):
            await trio.sleep(0.01)
        raise Refused("task")

    with pytest.raises(BaseExceptionGroup) as info:
        async with open_nursery_unwrapped() as nursery:
            await nursery.start(fail)
            raise KeyError("body")
    assert sorted(type(e).__name__ for e in info.value.exceptions) == ["KeyError", "Refused"]


async def test_an_outer_cancel_still_ends_the_body() -> None:
    with trio.move_on_after(0.01) as scope:
        async with open_nursery_unwrapped() as nursery:
            nursery.start_soon(trio.sleep_forever)
            await trio.sleep_forever()
    assert scope.cancelled_caught


async def test_the_clients_apis_raise_what_they_name() -> None:
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(RemotingConnectError):
        await topics.create_topic(dead, "T", brokers=[dead], timeout=1)
    with pytest.raises(KeyError):
        async with Producer("unwrapped", dead):
            raise KeyError("the caller's own")
