"""Log output of an agentkernel process: one line per record, as text or as JSON.

The library never installs a handler when imported; the process entry points do, through
:func:`configure`: the ``agentkernel`` command always, and the container entry points
(``ECSIOHandler.run``, ``ECSAgentRunner.run``) only when nothing configured logging before
(:func:`configure_unless_configured`), so an application that set up its own handlers keeps them.

Lines carry the turn they belong to: the message handling binds the request id, the session id
and the trace id of the message it works on (:func:`bind`), and every record logged while it runs
(by agentkernel or by the agent) gets them. The JSON format writes them as fields::

    {"time": "2026-12-02T05:42:37.120Z", "level": "INFO", "logger": "agentkernel.pipeline...",
     "thread": "input-turns", "message": "turn ... succeeded in 0.20s", "request_id": "...",
     "session_id": "...", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}

Whatever the format, characters a client chose (a session id with a line break) are escaped, so
one record is one line (:class:`~agentkernel.core.redact.PrintableFilter`).
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
from typing import Any, Literal, Protocol

from agentkernel.core.redact import PrintableFilter, printable

__all__ = [
    "CONTEXT_FIELDS",
    "JsonFormatter",
    "bind",
    "configure",
    "configure_unless_configured",
    "current",
    "trace_id_of",
]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"
#: Fields a record carries when they are known (bound by :func:`bind` or passed in ``extra``).
CONTEXT_FIELDS = ("request_id", "session_id", "trace_id")
Format = Literal["text", "json"]

_CONTEXT: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "agentkernel_log_context", default=None
)


class LogSettings(Protocol):
    """What :func:`configure` reads (``AKConfig.logging``)."""

    @property
    def format(self) -> Format: ...

    @property
    def ak(self) -> Any: ...


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``), if valid."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32:
        return None
    return parts[1]


class bind:  # lower case: used like a function, ``with logs.bind(request_id=...):``
    """Attach ``fields`` (``request_id``, ``session_id``, ``trace_id``) to every record logged in
    this context (this asyncio task, or this thread and what it calls); ``None`` values are
    left out.

    A class rather than a generator-based context manager: it is entered twice per turn.
    """

    __slots__ = ("_bound", "_token")

    def __init__(self, **fields: str | None) -> None:
        self._bound = (_CONTEXT.get() or {}) | {k: v for k, v in fields.items() if v}

    def __enter__(self) -> None:
        self._token = _CONTEXT.set(self._bound)

    def __exit__(self, *exc: object) -> None:
        # A coroutine closed late (collected after its loop stopped) ends here in another
        # context, where the token cannot be reset; that context never saw the fields anyway.
        if _CONTEXT.get() is self._bound:
            _CONTEXT.reset(self._token)


def current() -> dict[str, str]:
    """The fields bound in this context."""
    return dict(_CONTEXT.get() or {})


class ContextFilter(logging.Filter):
    """Copies the bound fields onto each record (a field passed in ``extra`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_CONTEXT.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: time (UTC), level, logger, thread, message, the
    context fields when known, and the formatted exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "thread": record.threadName,
            "message": record.getMessage(),
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value:
                doc[key] = printable(str(value))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        # ensure_ascii: U+2028 and friends, which some log shippers split on, stay escaped
        return json.dumps(doc, ensure_ascii=True, default=str)


def _utc(created: float) -> str:
    moment = datetime.datetime.fromtimestamp(created, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure` installs (recognised, so configuring again replaces it)."""


def configure(settings: LogSettings | None = None, level: str | None = None) -> None:
    """Send log records to standard error, one line each, in the configured format.

    Replaces the handler an earlier call installed and leaves any other handler alone.

    Args:
        settings: ``AKConfig.logging`` (format and the ``agentkernel`` loggers' level); default:
            text at INFO.
        level: the level of every logger, overriding ``settings`` (``--log-level``); without
            it, ``agentkernel`` loggers log at ``settings.ak.level`` and others at INFO.

    Raises:
        ValueError: ``level`` is not a level name.
    """
    fmt: Format = settings.format if settings is not None else "text"
    ak_level = (level or (settings.ak.level if settings is not None else "INFO")).upper()
    if not isinstance(logging.getLevelName(ak_level), int):
        raise ValueError(f"unknown log level {level!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    handler = _Handler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(ContextFilter())
    handler.addFilter(PrintableFilter())
    root.addHandler(handler)
    root.setLevel(ak_level if level else logging.INFO)
    logging.getLogger("agentkernel").setLevel(ak_level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per HTTP call otherwise


def configure_unless_configured(settings: LogSettings | None = None) -> bool:
    """:func:`configure`, unless the root logger already has a handler (the application set up
    logging its own way). Returns whether it configured."""
    root = logging.getLogger()
    if root.handlers and not all(isinstance(h, _Handler) for h in root.handlers):
        return False
    configure(settings)
    return True
