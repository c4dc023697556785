"""A real TCP proxy for outage tests: it forwards bytes both ways until told to refuse,
then cuts every connection it carries and closes its listening socket, so a client's
next connect is refused by the kernel (ECONNREFUSED), as a database host that went
away is. The port stays bound meanwhile (a socket that does not listen), so nothing
else takes it; ``restore`` listens again on it. ``stall`` leaves the connections
it carries open but forwards nothing more on them, both ways (a server or a network
gone silent, with no reset), while new connections are carried as before.

    with TcpProxy(("127.0.0.1", 5432)) as proxy:
        ... clients dial proxy.port ...
        proxy.refuse(); ...; proxy.restore()
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, backend: tuple[str, int]) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.refused_since: float | None = None
        self.accepted = 0
        self._stalled: set[socket.socket] = set()
        self._held: socket.socket | None = None  # the port, bound and not listening, while refused
        self._start_accepting()

    def _start_accepting(self) -> None:
        thread = threading.Thread(target=self._accept, args=(self._listener,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by refuse() or close()
            try:
                upstream = socket.create_connection(self.backend, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    stalled = src in self._stalled
                if not stalled:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with self._lock:
                    self._sockets.discard(sock)

    def refuse(self) -> None:
        """Stop listening (new connects are refused) and cut every open connection."""
        self._cut()
        if self._held is None:
            # Kept from anyone else's port-0 bind or connect (another test session on
            # this machine) until restore: connects to a bound port nobody listens on
            # are refused just the same.
            held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("127.0.0.1", self.port))
            self._held = held

    def _cut(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self._listener.close()
        with self._lock:
            open_sockets = list(self._sockets)
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def stall(self) -> None:
        """Forward nothing more on the connections open now (they stay open)."""
        with self._lock:
            self._stalled.update(self._sockets)

    def restore(self) -> None:
        """Listen again on the same port."""
        held, self._held = self._held, None
        assert held is not None, "restore() without refuse()"
        held.listen()
        self._listener = held
        self._start_accepting()

    def close(self) -> None:
        self._cut()
        held, self._held = self._held, None
        if held is not None:
            held.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
