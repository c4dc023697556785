"""The embedded default's broker (``controlplane/broker.py``): a message is consumed
once, whole, by one consumer, and a file that cannot be read never stops consuming."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

from kombu import Connection
from kombu.transport.virtual import BrokerState

from controlplane import broker
from controlplane.broker import PARTIAL_SUFFIX, Transport, message_stamp

QUEUE = "holdfast-test"


def _connection(root: Path) -> Connection:
    for folder in ("queue", "processed", "control"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    # kombu keeps the filesystem backend's declared bindings per process, so a second
    # broker folder in one process would skip writing its binding: a state per folder.
    transport = type("FolderTransport", (Transport,), {"global_state": BrokerState()})
    return Connection(
        "filesystem://localhost/",
        transport=transport,
        transport_options={
            "data_folder_in": str(root / "queue"),
            "data_folder_out": str(root / "queue"),
            "processed_folder": str(root / "processed"),
            "control_folder": str(root / "control"),
            "store_processed": False,
        },
    )


def test_an_unreadable_message_file_is_set_aside_and_consuming_goes_on(tmp_path):
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue(QUEUE)
        # What kombu's own transport leaves between creating a file and writing it,
        # named to be taken before the good message.
        torn = f"{message_stamp(0)}_torn.{QUEUE}.msg"
        (tmp_path / "queue" / torn).write_bytes(b"")
        queue.put({"n": 1})
        message = queue.get(timeout=2)
        assert message.payload == {"n": 1}
        message.ack()
        queue.close()
    assert [p.name for p in (tmp_path / "bad").iterdir()] == [torn]


def _take(queue, n: int) -> list:
    """The payloads of the next ``n`` messages, each acked, in the order taken."""
    taken = []
    for _ in range(n):
        message = queue.get(timeout=2)
        taken.append(message.payload)
        message.ack()
    return taken


def test_messages_are_taken_in_the_order_they_were_put(tmp_path, monkeypatch):
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue(QUEUE)
        # Each stamp one digit longer than the last must still sort after it.
        for n, at in enumerate((0.999, 1.0, 10.0)):
            monkeypatch.setattr(broker, "time", lambda at=at: at)
            queue.put(n)
        taken = _take(queue, 3)
        queue.close()
    assert taken == [0, 1, 2]


def test_messages_an_earlier_release_queued_are_taken_first_in_their_own_order(tmp_path, monkeypatch):
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue(QUEUE)
        for n in range(3):
            monkeypatch.setattr(broker, "time", lambda n=n: 1.0 + n)  # one stamp each
            queue.put(n)
        folder = tmp_path / "queue"
        names = sorted(os.listdir(folder))  # put order
        # The first two as the release before named them: an unpadded monotonic stamp.
        for name, old in zip(names[:2], ("1000", "999"), strict=True):
            os.rename(folder / name, folder / (old + name[len(message_stamp(0)) :]))
        taken = _take(queue, 3)
        queue.close()
    assert taken == [1, 0, 2]


def test_a_message_still_being_written_is_not_consumed(tmp_path):
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue(QUEUE)
        partial = tmp_path / "queue" / f"1_x.{QUEUE}.msg{PARTIAL_SUFFIX}"
        partial.write_bytes(b'{"half')
        assert queue.qsize() == 0
        try:
            queue.get(timeout=0.3)
            raise AssertionError("a partial file was consumed")
        except queue.Empty:
            pass
        queue.close()
    assert partial.exists()


def _produce(root: str, start: int, count: int) -> None:
    with _connection(Path(root)) as conn:
        queue = conn.SimpleQueue(QUEUE)
        for n in range(start, start + count):
            queue.put({"n": n})
        queue.close()


def _consume(root: str, out: str, stop_after_idle: float) -> None:
    seen = []
    with _connection(Path(root)) as conn:
        queue = conn.SimpleQueue(QUEUE)
        while True:
            try:
                message = queue.get(timeout=stop_after_idle)
            except queue.Empty:
                break
            seen.append(message.payload["n"])
            message.ack()
        queue.close()
    Path(out).write_text("\n".join(map(str, seen)))


def test_concurrent_producers_and_consumers_deliver_each_message_exactly_once(tmp_path):
    per_producer, producers = 400, 3
    ctx = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"consumed-{i}.txt" for i in range(2)]
    consumers = [ctx.Process(target=_consume, args=(str(tmp_path), str(out), 3.0)) for out in outs]
    writers = [
        ctx.Process(target=_produce, args=(str(tmp_path), i * per_producer, per_producer)) for i in range(producers)
    ]
    for p in consumers + writers:
        p.start()
    for p in writers + consumers:
        p.join(timeout=120)
        assert p.exitcode == 0
    consumed = [int(n) for out in outs for n in out.read_text().split()]
    assert sorted(consumed) == list(range(per_producer * producers))
    assert not (tmp_path / "bad").exists()
    assert os.listdir(tmp_path / "queue") == []


def _bind_each(root: str, me: int, exchanges: int, start) -> None:
    """Bind this process's own queue to each of ``exchanges`` fresh exchanges, beside
    the other binders, all released at once."""
    with _connection(Path(root)) as conn:
        channel = conn.default_channel
        channel.queue_declare(f"q-{me}")
        for k in range(exchanges):
            channel.exchange_declare(f"ex-{k}", type="direct")
        start.wait(timeout=60)
        for k in range(exchanges):
            channel.queue_bind(f"q-{me}", exchange=f"ex-{k}", routing_key=f"q-{me}")


def test_queues_bound_at_once_to_a_new_exchange_all_keep_their_binding(tmp_path):
    # Each binder finds the table missing or empty at the moment another creates it:
    # kombu's own reads the empty file (a JSON error) or truncates the other's binding.
    binders, exchanges = 4, 400
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(binders)
    procs = [ctx.Process(target=_bind_each, args=(str(tmp_path), me, exchanges, start)) for me in range(binders)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=120)
            assert p.exitcode == 0
    finally:
        for p in procs:
            p.kill()  # one that hangs must not outlive the test
    with _connection(tmp_path) as conn:
        channel = conn.default_channel
        for k in range(exchanges):
            bound = sorted(q.queue for q in channel.get_table(f"ex-{k}"))
            assert bound == [f"q-{me}" for me in range(binders)], f"ex-{k}"


def test_an_exchange_table_found_empty_is_a_table_not_yet_written(tmp_path):
    with _connection(tmp_path) as conn:
        channel = conn.default_channel
        # What a binder that has created the table but not yet written it leaves.
        (tmp_path / "control" / "ex.exchange").write_bytes(b"")
        assert channel.get_table("ex") == []
        channel.exchange_declare("ex", type="direct")
        for queue in ("q", "r"):
            channel.queue_declare(queue)
            channel.queue_bind(queue, exchange="ex", routing_key=queue)
        assert sorted(q.queue for q in channel.get_table("ex")) == ["q", "r"]
        channel.queue_delete("q")
        assert [q.queue for q in channel.get_table("ex")] == ["r"]
    # The shorter table was written over the longer in one write, padded rather than
    # truncated: what kombu's own reader (a process of the release before) parses.
    raw = (tmp_path / "control" / "ex.exchange").read_text()
    assert raw.endswith(" ") and [q[2] for q in json.loads(raw)] == ["r"]
