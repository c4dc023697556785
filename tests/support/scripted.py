"""Scripted hosts, named as such: a real WebSocket server on 127.0.0.1 port 0 whose
``handler`` plays a host of another release or a faulty one, where a test must control
exactly what the peer says (STYLE habit 6). Real hosts come from ``tests.support.host``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from websockets.sync.server import ServerConnection, serve


@contextlib.contextmanager
def scripted_host(handler: Callable[[ServerConnection], None], **options: Any) -> Iterator[str]:
    """Serve ``handler`` until the block ends, then shut down and join; yields the URL."""
    with serve(handler, "127.0.0.1", 0, **options) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
        finally:
            server.shutdown()
            thread.join(timeout=5)
