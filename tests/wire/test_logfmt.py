"""The one log style: a record with fields passed as data becomes one logfmt line."""

from __future__ import annotations

import logging

from holdfast_wire.logfmt import LogfmtFormatter, fields


def record(message: str, *args: object, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("holdfast.pool", level, __file__, 1, message, args, None)
    made.__dict__.update(extra)
    return made


def test_fields_follow_the_event_in_order_and_are_quoted_only_when_needed():
    line = LogfmtFormatter().format(
        record("connection_retiring", **fields(host_id="h1", reason="max age", age_s=12.34567, in_flight=0))
    )
    assert line.startswith("ts=")
    head = " level=info logger=holdfast.pool event=connection_retiring"
    assert line.endswith(f'{head} host_id=h1 reason="max age" age_s=12.346 in_flight=0')


def test_quotes_and_newlines_stay_on_one_line():
    line = LogfmtFormatter().format(record("x", **fields(text='say "hi"\nbye', empty="")))
    assert "\n" not in line and 'text="say \\"hi\\"\\nbye"' in line and 'empty=""' in line


def test_a_record_without_fields_keeps_its_message_as_the_event():
    line = LogfmtFormatter().format(record("celery@%s ready.", "w1", level=logging.WARNING))
    assert line.endswith(' level=warning logger=holdfast.pool event="celery@w1 ready."')
