"""The drain page in headless Chromium (Debian's ``chromium``), against Django's live
server, a real worker and two real hosts: a staff user logs in through the admin's login
form and watches a host go active -> draining -> gone while executions run, without a
page reload. The screenshot taken mid-drain is committed as docs/drain-page.png."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command

from controlplane.hosts.models import SandboxHost
from tests.hosts.test_worker_publisher import HOST_ARGS, Stream, worker_env
from tests.support.host import start_host
from tests.support.worker import start_worker
from tests.timing import scaled

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.peer,
    pytest.mark.usefixtures("owners"),
]

ROOT = Path(__file__).resolve().parents[2]
# CI must not leave the tree modified: the screenshot goes under var/ unless asked to
# refresh the committed one (HOLDFAST_UPDATE_DOCS=1 writes docs/drain-page.png).
SCREENSHOT = (
    ROOT / "docs" / "drain-page.png"
    if os.environ.get("HOLDFAST_UPDATE_DOCS") == "1"
    else ROOT / "var" / "screenshots" / "drain-page.png"
)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless Debian Chromium that never reaches the internet on its own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PAGE = "/admin/hosts/sandboxhost/drain-status/"


def chromium():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        message = "Debian's chromium is not installed (apt-get install chromium; .ci/run does it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return sync_api.sync_playwright()


def log_in(page, base: str, username: str) -> None:
    page.goto(f"{base}/admin/login/?next={PAGE}")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")


def host_state(page, name: str, state: str, timeout_s: float) -> None:
    page.wait_for_selector(f'[data-host="{name}"][data-state="{state}"]', timeout=scaled(timeout_s) * 1000)


def test_staff_watch_a_host_drain_and_go_while_executions_run(live_server, sandbox_token):
    staff = User.objects.create_user("operator", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_sandboxhost"))
    User.objects.create_user("customer", password="pw")
    with (
        start_host(sandbox_token, host_id="alpha", extra_args=HOST_ARGS) as alpha,
        start_host(sandbox_token, host_id="beta", extra_args=HOST_ARGS) as beta,
    ):
        SandboxHost.objects.create(name="alpha", address=alpha.url)
        SandboxHost.objects.create(name="beta", address=beta.url)
        drain_out: list[str] = []
        with start_worker(worker_env(sandbox_token, alpha, beta)), Stream(seconds=1.5) as stream:
            with chromium() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page(viewport={"width": 1100, "height": 900})
                    log_in(page, live_server.url, "operator")
                    page.wait_for_selector("#hf-hosts")
                    host_state(page, "alpha", "active", 30)
                    page.wait_for_function(
                        """() => Number(document.querySelector('[data-host="alpha"] [data-field="in_flight"]')
                                      ?.textContent) > 0""",
                        timeout=scaled(30) * 1000,
                    )
                    page.evaluate("window.__noReload = true")  # a full reload would drop it

                    def drain() -> None:
                        from io import StringIO

                        from django.db import connection

                        out = StringIO()
                        try:
                            call_command("drain_host", "alpha", "--timeout", str(scaled(30)), stdout=out)
                        finally:
                            drain_out.append(out.getvalue())
                            connection.close()

                    drainer = threading.Thread(target=drain)
                    drainer.start()
                    host_state(page, "alpha", "draining", 15)
                    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(SCREENSHOT), full_page=True)
                    alpha_text = page.inner_text('[data-host="alpha"]').lower()
                    assert "draining (operator)" in alpha_text
                    assert "drain started" in alpha_text and "empty by" in alpha_text
                    drainer.join()
                    host_state(page, "alpha", "gone", 30)
                    assert page.evaluate("window.__noReload === true")
                    beta_card = page.locator('[data-host="beta"]')
                    assert beta_card.get_attribute("data-state") == "active"
                    assert int(beta_card.locator('[data-field="connections"]').inner_text()) > 0
                    assert int(page.locator('[data-host="alpha"] [data-field="connections"]').inner_text()) == 0
                    # Readable on a phone: nothing wider than the screen.
                    page.set_viewport_size({"width": 380, "height": 800})
                    assert page.evaluate("(e => e.scrollWidth <= e.clientWidth)(document.querySelector('#hf-hosts'))")

                    other = browser.new_context().new_page()
                    log_in(other, live_server.url, "customer")
                    other.goto(live_server.url + PAGE)
                    assert "/admin/login/" in other.url
                    assert other.locator("#hf-hosts").count() == 0
                    response = other.goto(live_server.url + PAGE + "?format=json")
                    assert "/admin/login/" in other.url and "application/json" not in response.headers["content-type"]
                finally:
                    browser.close()
            # Outside the browser (its event loop makes the ORM refuse) but inside the worker, so
            # nothing stays queued.
            stream.stop()
            failures = {k: v for k, v in stream.outcomes().items() if v[0] != "succeeded"}
        assert "alpha: empty" in drain_out[0], drain_out
    assert failures == {}
