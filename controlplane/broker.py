"""The embedded default's broker: kombu's filesystem transport, made safe for more than
one process.

kombu's own transport creates a message file and only then writes it, and its consumer
claims a file with ``shutil.move`` (which ignores the writer's lock). A consumer that
lists the folder between the two takes an empty file: the message is lost (the writer's
bytes land in the moved file) and the JSON error kills the worker, which then consumes
nothing more. Here a message is written under a name no consumer matches and renamed
into place when complete, a consumer claims it with an atomic rename into the broker's
own ``processed`` folder (one winner, same filesystem), and a file that still does not
parse is set aside in ``bad/`` with a log line instead of stopping the worker.

The exchange tables in the control folder had the same flaw. kombu's binder opens a
table it does not find with ``"wb"`` and only then locks it, so a second binder either
reads the still-empty file (a JSON error: the process fails to declare its queue) or,
having missed it too, truncates what the first wrote (a binding lost: what is published
to that exchange reaches no queue). Here a table is opened without truncating, locked,
and only then read and rewritten; an empty table is one not yet written.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from collections.abc import Callable
from queue import Empty
from time import time

from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

from holdfast_wire.logfmt import fields

log = logging.getLogger("holdfast.broker")

PARTIAL_SUFFIX = ".partial"
# Consumers take files in name order, so a name starts with the wall-clock millisecond
# zero-padded to a fixed width: unpadded, "999_" sorts after "1000_", and kombu's
# monotonic stamp restarts at boot while the folder survives it.
STAMP_WIDTH = 15


def message_stamp(at: float | None = None) -> str:
    return f"{round((time() if at is None else at) * 1000):0{STAMP_WIDTH}d}"


def put_order(name: str) -> tuple[bool, int, str]:
    """A message file's place in the queue. Names an earlier release gave (an unpadded
    stamp, in its own numbers) come first, so a deploy does not leave what was queued
    before it behind everything queued after."""
    stamp = name.partition("_")[0]
    return len(stamp) == STAMP_WIDTH, int(stamp) if stamp.isdigit() else -1, name


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{message_stamp()}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + PARTIAL_SUFFIX
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue):
        wanted = f"{queue}.msg"
        claimed_dir = self.processed_folder
        for name in sorted(os.listdir(self.data_folder_in), key=put_order):
            if name.partition(".")[2] != wanted:
                continue  # another queue's, or a message still being written
            claimed = os.path.join(claimed_dir, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), claimed)
            except FileNotFoundError:
                continue  # another consumer won it
            except OSError as exc:
                raise filesystem.ChannelError(f"Cannot claim {name!r} from the queue") from exc
            try:
                with open(claimed, "rb") as f:
                    payload = f.read()
                message = loads(bytes_to_str(payload))
            except (OSError, ValueError) as exc:
                self._set_aside(claimed, name, exc)
                continue
            if not self.store_processed:
                os.remove(claimed)
            return message
        raise Empty()

    def _set_aside(self, claimed: str, name: str, exc: BaseException) -> None:
        bad_dir = os.path.join(os.path.dirname(os.path.abspath(self.processed_folder)), "bad")
        os.makedirs(bad_dir, exist_ok=True)
        try:
            os.replace(claimed, os.path.join(bad_dir, name))
        except OSError:
            pass
        log.error("broker_message_unreadable", extra=fields(file=name, error=exc.__class__.__name__))

    def get_table(self, exchange):
        try:
            fd = os.open(self._exchange_file(exchange), os.O_RDONLY)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot open the table of exchange {exchange!r}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return _table(_read_all(fd))
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot read the table of exchange {exchange!r}") from exc
        finally:
            os.close(fd)

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")

        def bind(queues: list) -> None:
            if binding not in queues:
                queues.insert(0, binding)

        self._update_table(exchange, bind)

    def _delete(self, queue, exchange, routing_key, pattern, *args, **kwargs):
        # kombu's filesystem transport rewrites the table itself: skip to the virtual
        # transport's part (it purges the queue's messages), then unbind here.
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")

        def unbind(queues: list) -> None:
            if binding in queues:
                queues.remove(binding)

        if os.path.exists(self._exchange_file(exchange)):
            self._update_table(exchange, unbind)

    def _update_table(self, exchange: str, change: Callable[[list], None]) -> None:
        """Read, change and rewrite one exchange's table under its lock. The file is
        created without truncating, so what another binder wrote is never cut away; a
        binder that finds it empty holds the lock before its creator, who then reads
        this binder's table. The new table is written in one write over the old, padded
        with spaces to the old length rather than truncated, so a process killed part
        way does not leave a table that does not parse (a write of up to a page is not
        split by a signal; a crash of the machine is another matter)."""
        path = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot open the table of exchange {exchange!r}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = _read_all(fd)
            queues = _table(raw)
            before = list(queues)
            change(queues)
            if queues == before and raw:
                return
            data = str_to_bytes(dumps(queues)).ljust(len(raw), b" ")
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(f"short write of the table of exchange {exchange!r}")
            os.fsync(fd)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot update the table of exchange {exchange!r}") from exc
        finally:
            os.close(fd)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.pread(fd, 65536, sum(map(len, chunks))):
        chunks.append(chunk)
    return b"".join(chunks)


def _table(raw: bytes) -> list:
    """An exchange's bindings; an empty file is a table its creator has not written yet."""
    text = bytes_to_str(raw).strip()
    return [filesystem.exchange_queue_t(*q) for q in loads(text)] if text else []


class Transport(filesystem.Transport):
    Channel = Channel
