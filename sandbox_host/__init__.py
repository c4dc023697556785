"""The sandbox host: a WebSocket server that runs executions (and run sandboxes) in
isolated child processes. Never imports Django, Celery or controlplane."""
