"""The steer route's delivery protocol (docs/runner-api.md, "steer"), through Django's test
client against PostgreSQL: fetching marks nothing, an ack marks exactly its ids, an ack is
refused whole, and a previous-release poll (cursor only) gets mark-on-select."""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import CommandError, call_command

from controlplane.runs import actions, steering
from controlplane.runs.models import SteerMessage

pytestmark = pytest.mark.django_db


def poll(running, **query):
    text = "&".join(f"{k}={v}" for k, v in query.items())
    return running.get("steer" + (f"?{text}" if text else ""))


def delivered(*messages: SteerMessage) -> list[bool]:
    return [SteerMessage.objects.get(pk=m.pk).delivered_at is not None for m in messages]


def test_fetching_marks_nothing_and_an_ack_marks_exactly_its_ids(running):
    first = steering.send(running.run_id, "steer", "one")
    second = steering.send(running.run_id, "interrupt")
    for _ in range(2):  # a lost answer: the same messages are served again
        answer = poll(running, ack="")
        assert answer.status_code == 200, answer.content
        assert [m["id"] for m in answer.json()["messages"]] == [first.id, second.id]
    assert delivered(first, second) == [False, False]
    assert SteerMessage.objects.get(pk=first.pk).attempts == 2
    answer = poll(running, ack=first.id)
    assert [m["id"] for m in answer.json()["messages"]] == [second.id]
    assert delivered(first, second) == [True, False]
    # A replayed ack changes nothing more.
    assert poll(running, ack=first.id).status_code == 200
    assert poll(running, ack=second.id).json()["messages"] == []
    assert delivered(first, second) == [True, True]


def _other_run_message() -> SteerMessage:
    from tests.runs.conftest import launched

    other, _key = launched()
    actions.runner_hello(other.id, "other-sandbox")
    return steering.send(other.id, "steer", "not yours")


@pytest.mark.parametrize(
    "bad",
    ["malformed", "thirty-three", "another-run", "interrupt-undeliverable", "never-issued"],
)
def test_an_ack_is_refused_whole_and_nothing_is_marked(running, bad):
    mine = [steering.send(running.run_id, "steer", f"m{i}") for i in range(3)]
    interrupt = steering.send(running.run_id, "interrupt")
    good = [m.id for m in mine]
    query = {"ack": ",".join(good)}
    if bad == "malformed":
        query["ack"] += ",sm_NOT-HEX"
    elif bad == "thirty-three":
        query["ack"] = ",".join(good + [m.id for m in mine] * 10)  # 33 ids
    elif bad == "another-run":
        query["ack"] += "," + _other_run_message().id
    elif bad == "interrupt-undeliverable":
        query["undeliverable"] = interrupt.id
    else:
        query["ack"] += ",sm_" + uuid.uuid4().hex
    answer = poll(running, **query)
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["code"] == "bad_ack"
    assert not SteerMessage.objects.filter(delivered_at__isnull=False).exists()
    assert not SteerMessage.objects.exclude(ended="").exists()


def test_a_cursor_only_poll_gets_mark_on_select_and_an_ack_wins_when_both_come(running):
    first = steering.send(running.run_id, "steer", "one")
    # A previous-release runner: first poll without anything, then with its cursor.
    assert [m["id"] for m in poll(running).json()["messages"]] == [first.id]
    assert delivered(first) == [True]
    second = steering.send(running.run_id, "steer", "two")
    assert [m["id"] for m in poll(running, after_id=first.id).json()["messages"]] == [second.id]
    assert delivered(second) == [True]
    assert poll(running, after_id=second.id).json()["messages"] == []
    # Both: the ack is used, nothing is marked from the select.
    third = steering.send(running.run_id, "steer", "three")
    fourth = steering.send(running.run_id, "steer", "four")
    answer = poll(running, after_id=second.id, ack=third.id)
    assert [m["id"] for m in answer.json()["messages"]] == [fourth.id]
    assert delivered(third, fourth) == [True, False]
    # The cursor is validated like an ack.
    assert poll(running, after_id="sm_" + uuid.uuid4().hex).status_code == 400


def test_an_undeliverable_steer_ends_and_is_served_no_more(running):
    stuck = steering.send(running.run_id, "steer", "stuck")
    answer = poll(running, ack="", undeliverable=stuck.id)
    assert answer.json()["messages"] == []
    row = SteerMessage.objects.get(pk=stuck.pk)
    assert (row.ended, row.delivered_at is None, row.ended_at is not None) == ("undeliverable", True, True)


def test_the_commands_send_and_a_terminal_run_is_refused_clearly(running):
    out = io.StringIO()
    call_command("steer", running.run_id, "go left", stdout=out)
    call_command("interrupt", running.run_id, stdout=out)
    kinds = list(SteerMessage.objects.filter(run_id=running.run_id).values_list("kind", "body"))
    assert kinds == [("steer", "go left"), ("interrupt", "")]
    actions.cancel_run(running.run_id)
    with pytest.raises(CommandError, match="already ended \\(cancelled\\); nothing was sent"):
        call_command("interrupt", running.run_id)
    with pytest.raises(CommandError, match="no such run"):
        call_command("steer", str(uuid.uuid4()), "x")
    assert SteerMessage.objects.filter(run_id=running.run_id).count() == 2
    # The runner's next poll is told the run is over.
    assert poll(running, ack="").status_code == 409


def test_a_malformed_id_is_refused_before_the_database_is_asked(running, django_assert_num_queries):
    steering.send(running.run_id, "steer", "one")
    with django_assert_num_queries(1):  # the run's row, for authentication; nothing else
        answer = poll(running, ack="sm_" + "z" * 32)
    assert answer.json()["error"]["code"] == "bad_ack"


@pytest.mark.django_db(transaction=True)
def test_the_asgi_long_poll_authenticates_and_is_rate_limited_like_every_runner_route(
    running, settings, monkeypatch, pinned_rate_clock
):
    """The long poll is served outside Django's request cycle; it still goes through the
    same authentication and rate limits (per key), and a 429 says when to retry."""
    import asyncio

    from django.db import connection

    from controlplane import pghub
    from controlplane.runs import steer_asgi

    settings.RUNS_API_RATE_PER_KEY = 2
    # The poll's database work runs on executor threads; their connections must close
    # after each call here, or the test database cannot be dropped at the end.
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    bearer = f"Bearer {running.token}"
    message = steering.send(running.run_id, "steer", "hello")

    async def scenario() -> list[tuple[int, dict]]:
        answers = [await steer_asgi.poll("GET", running.run_id, bearer, {"ack": [""]}, "10.9.9.9") for _ in range(3)]
        answers.append(await steer_asgi.poll("GET", running.run_id, "Bearer wrong", {"ack": [""]}, "10.9.9.8"))
        # This loop's listener holds a connection to the test database: close it.
        listening = pghub.hub(steering.STEER_CHANNEL)
        if listening is not None:
            await listening.close()
        return answers

    answers = asyncio.run(scenario())
    assert [status for status, _ in answers] == [200, 200, 429, 401]
    assert answers[2][1]["error"]["code"] == "rate_limited" and answers[2][1]["retry_after_s"] >= 1
    assert SteerMessage.objects.get(pk=message.pk).delivered_at is None
