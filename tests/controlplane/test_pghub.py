"""The LISTEN hub (controlplane/pghub.py): a closed hub neither calls itself available
nor is handed to a later event loop."""

from __future__ import annotations

import asyncio

import pytest

from controlplane import pghub
from tests.timing import scaled

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_closed_hub_is_not_available_and_a_later_loop_gets_its_own():
    async def scenario() -> tuple[pghub.Hub, bool, pghub.Hub]:
        listening = pghub.hub("holdfast_pghub_test")
        deadline = asyncio.get_running_loop().time() + scaled(10)
        while not listening.available:
            assert asyncio.get_running_loop().time() < deadline, "the listener never came up"
            await asyncio.sleep(0.05)
        await listening.close()
        return listening, listening._listening.is_set(), pghub.hub("holdfast_pghub_test")

    closed, still_listening, next_one = asyncio.run(scenario())
    assert not still_listening
    assert next_one is not closed
    asyncio.run(next_one.close())
