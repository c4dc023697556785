"""ASGI entry point for the ``web`` process (Procfile: uvicorn).

The runner's steer long poll is served by runs/steer_asgi.py without a thread per parked
poll; every other path goes to Django's ASGI handler (its sync views run in threads as
under WSGI). Lifespan events are acknowledged here: Django has none to run.
"""

import os
import re

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_application = get_asgi_application()

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
    return await django_application(scope, receive, send)
