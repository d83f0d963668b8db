"""``agentkernel sessions list|show|delete``: the sessions API of a running server, over HTTP.

    agentkernel sessions list [--limit N] [--cursor C] [--all]   one line per session, newest first
    agentkernel sessions show SESSION_ID                         the session as JSON
    agentkernel sessions delete SESSION_ID                       erase it everywhere

The server and the credential are given as for ``agentkernel chat`` (``--url``, ``--api-key``
or ``$AGENTKERNEL_API_KEY``, ``--token`` or ``$AGENTKERNEL_TOKEN``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Any

from agentkernel.cli.server import add_server_options
from agentkernel.client import ChatError
from agentkernel.sessions_client import SessionsClient

__all__ = ["add_parser", "run"]

#: Pages ``--all`` follows at most (at 100 sessions a page), so a listing always ends.
MAX_PAGES = 1000


def add_parser(sub: Any) -> None:
    """Add the ``sessions`` command to the subparsers ``sub`` of the ``agentkernel`` parser."""
    cmd = sub.add_parser("sessions", help="list, show or delete your sessions on a server")
    actions = cmd.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="your sessions, newest activity first")
    listing.add_argument("--limit", type=_limit, help="sessions per page (1-100; default 20)")
    listing.add_argument("--cursor", help="start after this page (the 'next' printed before)")
    listing.add_argument("--all", action="store_true", help="follow every page")
    show = actions.add_parser("show", help="a session's state, recent turns and last reply")
    show.add_argument("session_id")
    delete = actions.add_parser("delete", help="erase a session: state, turns, stored replies")
    delete.add_argument("session_id")
    for action in (listing, show, delete):
        add_server_options(action, 30.0, "seconds to wait per call")


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number from 1 to 100")
    return int(text)


def run(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """Run ``agentkernel sessions``, printing to ``out`` (default stdout); returns the exit
    status (1 when the server refused or could not be reached)."""
    out = out or sys.stdout
    client = SessionsClient(args.url, args.timeout, args.api_key, args.token)
    try:
        if args.action == "list":
            _list(client, args, out)
        elif args.action == "show":
            out.write(json.dumps(client.show(args.session_id), indent=2, ensure_ascii=False))
            out.write("\n")
        else:
            client.delete(args.session_id)
            out.write(f"deleted {args.session_id}\n")
    except ChatError as exc:
        print(f"agentkernel: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def _list(client: SessionsClient, args: argparse.Namespace, out: IO[str]) -> None:
    cursor = args.cursor
    for _ in range(MAX_PAGES):
        page = client.list(args.limit, cursor)
        for session in page["sessions"]:
            out.write(f"{session['session_id']}\t{session['last_activity_at']}\n")
        cursor = page.get("next_cursor")
        if not cursor:
            return
        if not args.all:
            print(f"more: --cursor {cursor}", file=sys.stderr)
            return
