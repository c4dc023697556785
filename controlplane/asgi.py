"""ASGI entry point for the ``web`` process (Procfile: uvicorn).

The runner's steer long poll is served by runs/steer_asgi.py without a thread per parked
poll, and (in the ``all`` role, which serves the public API) a run's event stream by
api/sse.py without a thread per stream; every other path goes to Django's ASGI handler (its sync views run in threads as
under WSGI). Lifespan events are acknowledged here: Django has none to run.
"""

import os
import re

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_application = get_asgi_application()

from django.conf import settings  # noqa: E402

from controlplane.api import sse  # noqa: E402  (after Django is set up)
from controlplane.runs import steer_asgi  # noqa: E402  (after Django is set up)

STEER_PATH = re.compile(r"^/internal/runs/([^/]+)/steer/?\Z")


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "http":
        match = STEER_PATH.match(scope["path"])
        if match:
            return await steer_asgi.handle(scope, receive, send, match.group(1))
        # Only where the URL map serves the public API: the runner-api role must not.
        if settings.ROOT_URLCONF == settings.WEB_ROLES["all"]:
            run_id = sse.stream_route(scope)
            if run_id is not None:
                return await sse.handle(scope, receive, send, run_id)
    return await django_application(scope, receive, send)
