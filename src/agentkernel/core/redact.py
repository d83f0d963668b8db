"""Keep credentials out of thread names, log lines and error messages.

Broker and store URLs may carry a password or a token (``nats://user:secret@host``,
``redis://:secret@host/0``, ``...?token=secret``). Every place that formats such a URL for a human
goes through :func:`redact_url` first.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
#: A query parameter whose name contains one of these (any case) holds a credential.
SECRET_QUERY_FRAGMENTS = ("pass", "token", "secret", "auth", "key", "sig", "credential", "jwt")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>,]+")
_PASSWORD = re.compile(r"(://[^:/@\s]*):[^@/\s]*@")  # also when the password holds a comma


def redact_url(text: str) -> str:
    """Return ``text`` with the password, token and secret query values of every URL in it
    replaced by ``***``.

    ``user:password@`` keeps the user name; a lone ``token@`` is masked whole (NATS and Redis
    read it as a token). Works on a single URL, a comma-separated list of them, or a message
    (an exception's text) that mentions URLs.
    """
    text = _PASSWORD.sub(rf"\1:{MASK}@", text)
    return _URL.sub(lambda match: _redact_one(match.group(0)), text)


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + f"://{MASK}"  # unparseable: keep only the scheme
    netloc = _redact_netloc(parts.netloc)
    query = redact_query(parts.query)
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _redact_netloc(netloc: str) -> str:
    userinfo, at, host = netloc.rpartition("@")
    if not at:
        return netloc
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"


def redact_query(query: str) -> str:
    """A URL query string with the values of credential-like keys replaced by ``***``."""
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(_secret(name) for name, _ in pairs):
        return query
    return urlencode([(name, MASK if _secret(name) else value) for name, value in pairs], safe="*")


_QUERY_PAIR = re.compile(r"([?&;])([^=&;?\s\"'#]+)=([^&;\s\"'#]*)")


def redact_queries(text: str) -> str:
    """``text`` (a log line naming a path such as ``/ws?token=...``) with the values of
    credential-like query parameters replaced by ``***``."""
    return _QUERY_PAIR.sub(
        lambda m: f"{m.group(1)}{m.group(2)}={MASK if _secret(m.group(2)) else m.group(3)}", text
    )


def _secret(name: str) -> bool:
    lowered = name.lower()
    return any(fragment in lowered for fragment in SECRET_QUERY_FRAGMENTS)


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1b``, ``\\x85``,
    ``\\u2028``, a lone surrogate as ``\\ud800``), so a value a client chose (a path, a user
    id, a session id) cannot start a forged line in a log, whatever splits lines there."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def _escaped(char: str) -> str:
    return char.encode("unicode_escape").decode("ascii")


class PrintableFilter(logging.Filter):
    """Escapes non-printable characters in a record's message (see :func:`printable`).

    Installed by the ``agentkernel`` command on its log handler, so every line stays one line
    whatever client text a message quotes; install it on your own handler when embedding.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = printable(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
