"""The one redactor: a secret embedded anywhere never survives; secret-shaped text goes too."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from runner.log import fields, log, use_redactor
from runner.redact import CUT_MARKER, REDACTED, Redactor, diagnostic_fields

SECRET_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
secrets_ = st.text(SECRET_CHARS, min_size=8, max_size=40).filter(lambda s: s not in REDACTED and s.strip() == s)
filler = st.text(SECRET_CHARS, max_size=30)
LABELS = ["password", "PASSWORD", "db_password", "secret", "client_secret", "token", "GITHUB_TOKEN", "api key"]
LABELS += ["api_key", "API-Key", "apikey", "access key", "AWS_ACCESS_KEY", "secret_key", "passwd"]
SEPARATORS = [":", "=", ": ", " = ", "="]


def strings_of(secret: str) -> st.SearchStrategy[str]:
    """Text with the secret in it: bare, several times, after a label, or in JSON."""
    return st.one_of(
        st.tuples(filler, filler).map(lambda p: p[0] + secret + p[1]),
        st.tuples(filler, filler).map(lambda p: p[0] + secret + p[1] + secret),
        st.tuples(st.sampled_from(LABELS), st.sampled_from(SEPARATORS), st.sampled_from(["", '"', "'"])).map(
            lambda p: f"{p[0]}{p[1]}{p[2]}{secret}{p[2]} rest"
        ),
        st.just(json.dumps({"nested": secret})),
        filler,
    )


def documents(secret: str) -> st.SearchStrategy[Any]:
    leaves = st.one_of(strings_of(secret), st.integers(), st.none(), st.booleans())
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.tuples(children, children),
            st.dictionaries(st.one_of(strings_of(secret), filler), children, max_size=4),
        ),
        max_leaves=12,
    )


def all_strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*all_strings(k), *all_strings(v)]]
    if isinstance(value, list | tuple):
        return [s for item in value for s in all_strings(item)]
    return []


@settings(max_examples=150, deadline=None)
@given(data=st.data(), secret=secrets_)
def test_an_injected_secret_embedded_anywhere_never_survives(data: st.DataObject, secret: str) -> None:
    document = data.draw(documents(secret))
    out = Redactor([secret, "another-secret-value"]).value(document)
    for text in all_strings(out):
        assert secret not in text


@settings(max_examples=200, deadline=None)
@given(
    label=st.sampled_from(LABELS),
    sep=st.sampled_from(SEPARATORS),
    quote=st.sampled_from(["", '"', "'"]),
    value=st.text(st.sampled_from("abcdefXYZ0123456789!@#$%^*+-_./~"), min_size=8, max_size=40),
)
def test_a_value_after_a_label_never_survives_unknown(label: str, sep: str, quote: str, value: str) -> None:
    """No injected secret known: the label alone is enough."""
    template = f"config {label}{sep}{quote}{{}}{quote} end"
    assume(value not in template)
    out = Redactor().text(template.format(value))
    assert value not in out
    assert out.startswith("config ") and out.endswith(" end")


def logged(event: str, data: dict, secrets: list[str]) -> str:
    """What the runner's log writes for ``event`` with ``data`` under a run redactor
    knowing ``secrets``: the real path (diagnostic_fields, then runner/log.py)."""
    redactor = Redactor(secrets)
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(out):
            use_redactor(redactor)
            log.warning(event, extra=fields(**diagnostic_fields(data, redactor)))
    finally:
        use_redactor(Redactor(()))
    return out.getvalue()


@settings(max_examples=200, deadline=None)
@given(secret=secrets_, prefix=filler, cut_at=st.integers(min_value=1, max_value=600))
def test_a_diagnostic_line_never_carries_a_secret(secret: str, prefix: str, cut_at: int) -> None:
    error = (prefix * 40)[:cut_at] + secret + prefix
    line = logged("result_discarded_run_terminal", {"error": error, "body": secret}, [secret])
    assert secret not in line


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ("Authorization: Bearer abc.DEF-123_x~+/==", "abc.DEF-123_x~+/=="),
        ("curl -H 'authorization: bearer s3ss10n-t0k3n'", "s3ss10n-t0k3n"),
        (
            "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U ok",
            "eyJhbGciOiJIUzI1NiJ9",
        ),
        ('{"password": "hunter2!"}', "hunter2!"),
        ("DB_PASSWORD=pa55w0rd;next", "pa55w0rd"),
        ("api key: 'k-1234567'", "k-1234567"),
        ("Access-Key = AKIAABCDEFG", "AKIAABCDEFG"),
        ("client_secret='sh h'", "sh h"),
        ("https://x/?token=abc123&y=1", "abc123"),
    ],
)
def test_secret_shaped_text_is_redacted(text: str, gone: str) -> None:
    out = Redactor().text(text)
    assert gone not in out
    assert REDACTED in out


@pytest.mark.parametrize("text", ["max_tokens: 100", "tokens=5", "the secret garden", "passwords are hard"])
def test_ordinary_text_near_labels_is_kept(text: str) -> None:
    assert Redactor().text(text) == text


def test_keys_are_redacted_and_sensitive_keys_lose_their_values() -> None:
    secret = "s3cr3t-value-01"
    out = Redactor([secret]).value({secret: [secret, ("x", secret)], "password": "plain", "Api_Key": 12345678, "n": 3})
    assert out == {REDACTED: [REDACTED, ["x", REDACTED]], "password": REDACTED, "Api_Key": REDACTED, "n": 3}


def test_short_injected_secrets_are_kept_but_run_keys_are_always_redacted() -> None:
    r = Redactor(["short", "long-enough-1"], keys=["k3y"])
    assert r.text("short long-enough-1 k3y") == f"short {REDACTED} {REDACTED}"


def test_diagnostic_fields_keep_only_allowlisted_scalars() -> None:
    kept = diagnostic_fields(
        {"attempted_status": "succeeded", "recorded_status": "failed", "exit_code": 0, "summary": {"a": 1}}, []
    )
    assert kept == {"attempted_status": "succeeded", "exit_code": 0, "recorded_status": "failed", "omitted": 1}
    assert "pull request body" not in logged("x", {"pull_request_body": "pull request body"}, [])


def test_diagnostic_fields_are_cut_after_redaction() -> None:
    """Cutting first would leave the head of a secret that no longer matches it."""
    secret = "S3CR-ETVALUE-0001"
    kept = diagnostic_fields({"error": "a" * 508 + secret}, [secret])
    assert "S3CR" not in kept["error"] and kept["error"].endswith(CUT_MARKER)
    line = logged("x", {"error": "a" * 508 + secret}, [secret])
    assert "S3CR" not in line and len(line) < 700


def test_a_log_line_is_redacted_again_whole() -> None:
    """A secret spanning two fields is only visible in the finished line."""
    secret = "x reason=y"
    line = logged("x", {"error": "x", "reason": "y"}, [secret])
    assert "event=x " in line and secret not in line


def test_a_log_line_stays_on_one_line() -> None:
    assert "\n" not in logged("x", {"error": "a\nb"}, []).rstrip("\n")
