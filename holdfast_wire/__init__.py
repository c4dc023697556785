"""The worker <-> sandbox host wire, neutral ground for both sides.

Standard library only: it imports nothing of Django, Celery, ``controlplane`` or
``sandbox_host``, and both of those import it, never each other (DESIGN.md, Layout).

* ``protocol``: the typed frames and their codec (pure functions);
* ``client``: the client session (the pool, the launch driver, the reconcile prober);
* ``server``: the server session (the host);
* ``addresses``: the host address list;
* ``backoff``: the one backoff schedule every retrying loop uses;
* ``logfmt``: the one log formatter of the control plane and the host (it lives here
  because this is the one package both sides import).

The sessions do no I/O: fed messages, they return events and the frames to send, so
their tests never open a socket (``tests/wire/``). Each caller is a thin shell around
one of them that owns the socket, the threads and the timeouts.
"""
