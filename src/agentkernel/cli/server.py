"""The options every command that talks to a running server takes: where it is and who asks.

``agentkernel chat`` and ``agentkernel sessions`` share them, so both read ``$AGENTKERNEL_URL``,
``$AGENTKERNEL_API_KEY`` and ``$AGENTKERNEL_TOKEN`` and refuse a malformed URL alike.
"""

from __future__ import annotations

import argparse
import os

URL_ENV = "AGENTKERNEL_URL"
DEFAULT_URL = "http://127.0.0.1:8000"


def server_url(text: str) -> str:
    """``--url`` (also applied to its default, ``$AGENTKERNEL_URL``): an http(s) base URL."""
    import httpx

    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError):
        url = None
    if (
        url is None
        or url.scheme not in ("http", "https")
        or not url.host
        or not 0 < (url.port or 80) < 65536
    ):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a server URL like {DEFAULT_URL} (from --url or ${URL_ENV})"
        )
    return text


def add_server_options(parser: argparse.ArgumentParser, timeout: float, timeout_help: str) -> None:
    """Add ``--url``, ``--timeout`` (seconds, default ``timeout``), ``--api-key``, ``--token``."""
    parser.add_argument(
        "--url",
        default=os.environ.get(URL_ENV) or DEFAULT_URL,
        type=server_url,
        help=f"server base URL (default ${URL_ENV}, else {DEFAULT_URL})",
    )
    parser.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("AGENTKERNEL_API_KEY"),
        help="API key for a server with authentication on (default $AGENTKERNEL_API_KEY)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("AGENTKERNEL_TOKEN"),
        help="bearer token (JWT) for a server with authentication on (default $AGENTKERNEL_TOKEN)",
    )
