"""A text field that stores any Python string, NUL included, and gives it back unchanged.

PostgreSQL's ``text`` cannot hold U+0000 (storing it raises ``DataError``), yet a
snippet's output may contain it (``print('\\0')``, any binary written to stdout). The
host decodes a child's raw output as UTF-8 with invalid bytes replaced by U+FFFD
(``docs/protocol.md``); from there on, what the host sent is what the caller reads:

* a value without NUL that does not start with ``ENCODED_PREFIX`` is stored as is, so
  ordinary output stays readable and searchable in the database;
* any other value is stored as ``ENCODED_PREFIX`` + base64 of its UTF-8 bytes. A value
  that happened to start with the prefix is encoded too, so decoding is never ambiguous.
"""

from __future__ import annotations

import base64

from django.db import models

# ESC cannot come from ``print`` of ordinary text by accident, and a prefix that does
# still round-trips (it is encoded).
ENCODED_PREFIX = "\x1bholdfast-b64:"


def encode(value: str) -> str:
    if "\x00" not in value and not value.startswith(ENCODED_PREFIX):
        return value
    # surrogatepass: a lone surrogate (never produced by the host, but possible from a
    # Python caller) is kept rather than turning the whole result into an error.
    return ENCODED_PREFIX + base64.b64encode(value.encode("utf-8", errors="surrogatepass")).decode("ascii")


def decode(stored: str) -> str:
    if not stored.startswith(ENCODED_PREFIX):
        return stored
    return base64.b64decode(stored[len(ENCODED_PREFIX) :]).decode("utf-8", errors="surrogatepass")


class OutputField(models.TextField):
    """``TextField`` whose values round-trip NUL (see the module docstring)."""

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return encode(value) if isinstance(value, str) else value

    def from_db_value(self, value, expression, connection):
        return decode(value) if isinstance(value, str) else value
