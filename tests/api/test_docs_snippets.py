"""Code blocks of the docs, run as written against a real server."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tests.api.conftest import Server

DOCS = Path(__file__).resolve().parents[2] / "docs"


def snippet(page: str, name: str) -> str:
    """The fenced code block after ``<!-- snippet: name -->`` on ``docs/<page>``."""
    text = (DOCS / page).read_text()
    found = re.search(rf"<!-- snippet: {name} -->\n```\w+\n(.*?)```", text, re.DOTALL)
    assert found, f"no snippet {name} in {page}"
    return found.group(1)


def test_the_chat_client_snippet_runs_as_documented(server: Server) -> None:
    code = snippet("http-api.md", "chat-client").replace("http://127.0.0.1:8000", server.url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "http-api.md", "exec"), {})
    lines = out.getvalue().splitlines()
    # the test server's echo agent numbers the session's turns
    assert lines == ["hello #1", "later #2", "stream this #3"], lines


def test_the_docs_page_is_served(server: Server) -> None:
    page = server.client.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    assert "/openapi.json" in page.text
