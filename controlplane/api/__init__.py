"""The public JSON API under ``/api/v1/`` (docs/api.md, docs/openapi.json): executions,
runs, their events (a JSON page and a server-sent-events stream), steering and cancel,
for services outside this Django project, authenticated by an owner's API key."""
