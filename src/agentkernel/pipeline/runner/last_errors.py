"""What a turn failed with, told safely: the last error of each turn this process saw, and the
one-line form (:func:`cause_of`) that replies quote.

A reply goes to the caller, who is not the operator: an exception's text may hold a broker URL
with its password or a token in a query, a control character that forges log lines, or a whole
model response. :func:`cause_of` keeps the class name and a bounded, redacted, printable message.
"""

from __future__ import annotations

from collections import OrderedDict

from agentkernel.core.redact import printable, redact_queries, redact_url

#: The longest cause a reply quotes, in characters (longer ones end with ``...``).
MAX_CAUSE = 300
#: What :meth:`LastErrors.get` says of a turn this process did not see fail.
NOT_SEEN = "not seen by this process (a crash, a lost lease, or another replica)"


def cause_of(exc: BaseException) -> str:
    """``"ClassName: message"`` of ``exc``, safe to show a caller.

    URL passwords and credential-like query values are masked, non-printable characters
    escaped (one line), and the whole cut to :data:`MAX_CAUSE` characters.
    """
    name = type(exc).__name__
    text = str(exc)
    if not text:
        return name
    cause = f"{name}: {printable(redact_queries(redact_url(text)))}"
    return cause if len(cause) <= MAX_CAUSE else cause[: MAX_CAUSE - 3] + "..."


class LastErrors:
    """The cause (:func:`cause_of`) of the last error seen per request id (the latest ``SIZE``)."""

    SIZE = 1024

    def __init__(self) -> None:
        self._errors: OrderedDict[str, str] = OrderedDict()

    def remember(self, request_id: str, exc: BaseException) -> None:
        """Keep ``exc`` as the last error of ``request_id``."""
        self._errors[request_id] = cause_of(exc)
        self._errors.move_to_end(request_id)
        while len(self._errors) > self.SIZE:
            self._errors.popitem(last=False)

    def get(self, request_id: str) -> str:
        """The cause of the last error of ``request_id``, or :data:`NOT_SEEN`."""
        return self._errors.get(request_id, NOT_SEEN)
