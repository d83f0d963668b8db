"""The last error each turn failed with in this process, for the line that abandons it."""

from __future__ import annotations

from collections import OrderedDict


class LastErrors:
    """The last error seen per request id (the latest ``SIZE`` request ids)."""

    SIZE = 1024

    def __init__(self) -> None:
        self._errors: OrderedDict[str, str] = OrderedDict()

    def remember(self, request_id: str, exc: BaseException) -> None:
        self._errors[request_id] = f"{type(exc).__name__}: {exc}"
        self._errors.move_to_end(request_id)
        while len(self._errors) > self.SIZE:
            self._errors.popitem(last=False)

    def get(self, request_id: str) -> str:
        return self._errors.get(
            request_id, "not seen by this process (a crash, a lost lease, or another replica)"
        )
