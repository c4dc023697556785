"""A database outage loses no result: executions that finish while PostgreSQL refuses
connections (a real TCP proxy between the worker and the database, closed for 120 s,
the outage the issue measured) are recorded once it is back, each once."""

from __future__ import annotations

import time

import pytest

from tests.support.host import start_host
from tests.support.tcp_proxy import TcpProxy
from tests.support.worker import children_database_url, start_worker
from tests.timing import scaled, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.apart,
    pytest.mark.django_db(transaction=True),
    pytest.mark.peer,
    pytest.mark.usefixtures("owners"),
]

# Longer than every in-worker patience the old code had (31 s) and than the new inline
# one (7 s), so the outcomes must outlive the task that produced them.
OUTAGE_S = 120.0


def test_executions_finishing_during_a_database_outage_are_recorded_after_it(sandbox_token):
    from django.db import connection

    from controlplane.executions.api import submit
    from controlplane.executions.models import Execution

    code = "import time\ntime.sleep(3)\nprint('done', '\\0')\n"
    db = connection.settings_dict
    with TcpProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))) as proxy:
        direct = children_database_url()
        via_proxy = direct.replace(f":{db['PORT'] or 5432}/", f":{proxy.port}/")
        assert via_proxy != direct
        with start_host(sandbox_token) as host:
            env = {
                "HOLDFAST_SANDBOX_URL": host.url,
                "HOLDFAST_SANDBOX_TOKEN": sandbox_token,
                "DATABASE_URL": via_proxy,
            }
            with start_worker(env, concurrency=4) as worker:
                ids = [str(submit(code, owner="outage-test", timeout_s=30)) for _ in range(3)]
                wait_until(
                    lambda: Execution.objects.filter(pk__in=ids, status="running").count() == 3,
                    timeout=30,
                    what="three executions running",
                )
                proxy.refuse()
                time.sleep(OUTAGE_S)  # the executions finish 3 s into it
                assert Execution.objects.filter(pk__in=ids, status="running").count() == 3
                proxy.restore()
                wait_until(
                    lambda: Execution.objects.filter(pk__in=ids, status="succeeded").count() == 3,
                    timeout=scaled(60),
                    what="the results stored after the outage",
                )
    assert worker.output().count("event=execution_result_spooled") == 3
    rows = Execution.objects.filter(pk__in=ids)
    assert all(r.stdout == "done \0\n" and r.exit_code == 0 for r in rows)
    assert all(r.attempts == 1 for r in rows)  # each sent to a host once
