"""The HTTP protocol a server test runs against: httptools (llhttp) and h11, each in turn."""

from __future__ import annotations

import sys

import pytest

PARSERS = ["httptools", "h11"]


@pytest.fixture(params=PARSERS)
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``server_options`` picks h11 here as it does where httptools is not installed."""
    if request.param == "h11":
        monkeypatch.setitem(sys.modules, "httptools", None)  # `import httptools` fails
    return str(request.param)
