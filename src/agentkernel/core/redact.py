"""Keep credentials out of thread names, log lines and error messages.

Broker and store URLs may carry a password or a token (``nats://user:secret@host``,
``redis://:secret@host/0``, ``...?token=secret``). Every place that formats such a URL for a human
goes through :func:`redact_url` first.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
SECRET_QUERY_KEYS = frozenset({"password", "pass", "passwd", "token", "secret", "auth", "key"})
_USERINFO = re.compile(r"(?<=://)([^/@\s]*)@")


def redact_url(url: str) -> str:
    """Return ``url`` with its password, token and secret query values replaced by ``***``.

    ``user:password@`` keeps the user name; a lone ``token@`` is masked whole (NATS and Redis
    read it as a token). A comma-separated list of URLs is redacted item by item. Text that does
    not parse as a URL is still stripped of anything that looks like ``userinfo@``.
    """
    if "," in url:
        return ",".join(redact_url(part) for part in url.split(","))
    try:
        parts = urlsplit(url)
    except ValueError:
        return _USERINFO.sub(f"{MASK}@", url)
    netloc = _redact_netloc(parts.netloc)
    query = _redact_query(parts.query)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _redact_netloc(netloc: str) -> str:
    userinfo, at, host = netloc.rpartition("@")
    if not at:
        return netloc
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"


def _redact_query(query: str) -> str:
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(name.lower() in SECRET_QUERY_KEYS for name, _ in pairs):
        return query
    return urlencode(
        [(name, MASK if name.lower() in SECRET_QUERY_KEYS else value) for name, value in pairs],
        safe="*",
    )
