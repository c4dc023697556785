"""The one redactor for everything the runner (and the control plane) writes outside a run's
event stream, and for the event stream itself.

What it removes: the run's own key(s), injected secrets of 8+ characters, bearer tokens,
JWT-shaped strings, and values after labels such as password, secret, token, api key or
access key (``:`` or ``=``, quoted or not). Strings are redacted; dicts (keys too) and
lists recursively. A dict value under a sensitive key is replaced whole.

``diagnostic_fields`` is what a log line outside the event stream may carry (DESIGN.md:
diagnostics never carry secrets): only allowlisted scalar fields, each redacted and then
cut; ``runner/log.py`` redacts the finished line again.

Standard library only: the control plane imports this module too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "«redacted»"

# Limits
# Shorter injected values are too common as ordinary text ("true", "8080") to redact
# without destroying the line; the run's own keys are redacted whatever their length.
MIN_SECRET_LEN = 8
# Each diagnostic field is cut here: enough for an error message, too little for a dump.
DEFAULT_FIELD_MAX_CHARS = 512
CUT_MARKER = "…[cut]"
# Replacing a secret can, in contrived text, join neighbours into a secret again; a few
# passes settle that, and past them the whole string is withheld.
_MAX_PASSES = 4
# Recursion bound for nested data: deeper structure is withheld, not walked.
_MAX_DEPTH = 32

# Fields a diagnostic line may carry: coordinates, never payloads (no job, no output).
DIAGNOSTIC_FIELDS = frozenset(
    {
        "run_id",
        "endpoint",
        "attempted_status",
        "recorded_status",
        "status",
        "exit_code",
        "code",
        "attempts",
        "error",
        "reason",
        "events_sent",
        "events_dropped",
    }
)

_LABEL = (
    r"(?:password|passwd|pwd|secret[ _-]?key|secret|token|api[ _-]?key|access[ _-]?key|private[ _-]?key|authorization)"
)
_LABEL_VALUE = re.compile(
    # A label, possibly the tail of a longer name (DB_PASSWORD, client_secret: the head is
    # left outside the match, which keeps the scan linear), possibly quoted as a JSON key,
    # then : or =, then a quoted or bare value.
    r"(?i)(?P<label>" + _LABEL + r")(?P<q>[\"']?)(?P<sep>\s*[:=]\s*)"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s,;&\"'})\]]+)"
)
_BEARER = re.compile(r"(?i)\b(bearer)(\s+)[A-Za-z0-9\-._~+/]+=*")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}")
_SENSITIVE_KEY = re.compile(r"(?i)" + _LABEL + r"$")


def _label_sub(match: re.Match[str]) -> str:
    value = match.group("value")
    quote = value[0] if value[0] in "\"'" else ""
    return f"{match.group('label')}{match.group('q')}{match.group('sep')}{quote}{REDACTED}{quote}"


class Redactor:
    """Redacts known secrets and secret-shaped text. Build one per run with its keys and
    injected secrets; it holds them only to find them."""

    def __init__(self, secrets: Iterable[str] = (), *, keys: Iterable[str] = ()) -> None:
        found = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}
        found |= {k for k in keys if isinstance(k, str) and k}
        # Longest first, so a secret that contains another is removed whole.
        ordered = sorted(found, key=lambda s: (-len(s), s))
        self._literal = re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None
        self._secrets = tuple(ordered)

    def text(self, value: str) -> str:
        for _ in range(_MAX_PASSES):
            out = value
            if self._literal is not None:
                out = self._literal.sub(REDACTED, out)
            out = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", out)
            out = _JWT.sub(REDACTED, out)
            out = _LABEL_VALUE.sub(_label_sub, out)
            if not any(s in out for s in self._secrets):
                return out
            value = out
        return REDACTED

    def value(self, value: Any, _depth: int = 0) -> Any:
        """Redact a string, or a dict (keys too) / list / tuple recursively; other scalars pass."""
        if isinstance(value, str):
            return self.text(value)
        if _depth >= _MAX_DEPTH:
            return REDACTED if isinstance(value, Mapping | list | tuple) else value
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                if isinstance(key, str) and _SENSITIVE_KEY.search(key) and isinstance(item, str | int | float):
                    # {"password": "x"}: the value is secret whatever it looks like.
                    item = REDACTED
                out[self.value(key, _depth + 1) if isinstance(key, str) else key] = self.value(item, _depth + 1)
            return out
        if isinstance(value, list | tuple):
            return [self.value(item, _depth + 1) for item in value]
        return value

    __call__ = value


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + CUT_MARKER


def diagnostic_fields(
    fields: Mapping[str, Any],
    secrets: Iterable[str] | Redactor = (),
    *,
    field_max_chars: int = DEFAULT_FIELD_MAX_CHARS,
) -> dict[str, Any]:
    """The allowlisted scalar fields of ``fields``, sorted by name, each string redacted
    BEFORE it is cut (cutting first could leave half a secret that no longer matches).
    Fields outside the allowlist, and non-scalar values, are left out and counted in
    ``omitted``."""
    redactor = secrets if isinstance(secrets, Redactor) else Redactor(secrets)
    kept: dict[str, Any] = {}
    omitted = 0
    for key in sorted(fields):
        value = fields[key]
        if key not in DIAGNOSTIC_FIELDS or not (value is None or isinstance(value, str | int | float | bool)):
            omitted += 1
            continue
        kept[key] = _cut(redactor.text(value), field_max_chars) if isinstance(value, str) else value
    if omitted:
        kept["omitted"] = omitted
    return kept
