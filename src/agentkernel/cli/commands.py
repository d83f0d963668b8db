"""The ``agentkernel`` command: wires configuration, agents and entry points together.

    agentkernel serve AGENTS      API + runner + output consumers in one process (embedded)
    agentkernel io                API + output consumers (the containerized IO process)
    agentkernel runner AGENTS     Agent Runner only (the containerized runner process)
    agentkernel chat [PROMPT]     send a turn to a running server and print the reply
                                  (--stream: as it is produced; no PROMPT: interactive)
    agentkernel sessions ACTION   list, show or delete your sessions on a running server

AGENTS is a ``.py`` file or an importable ``module`` / ``module:attr`` that registers agents.
"""

from __future__ import annotations

import argparse
import errno
import logging
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from agentkernel import __version__
from agentkernel import db as db_command
from agentkernel.cli import sessions as cli_sessions
from agentkernel.cli.server import add_server_options
from agentkernel.core import logs
from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config.root import AKConfig
from agentkernel.core.config.turns import MultitaskStrategy
from agentkernel.core.errors import AKConfigError, StoreError, TransportError
from agentkernel.core.loading import importable, load_agents

if TYPE_CHECKING:
    from agentkernel.pipeline.process.io_handler import IOHandler
    from agentkernel.pipeline.runner.agent_runner import AgentRunner

__all__ = ["StartupError", "build_parser", "load_agents", "main"]

_T = TypeVar("_T")

#: The variable ``agentkernel chat`` reads the server's URL from when ``--url`` is not given.


class StartupError(Exception):
    """A process could not start: a broker or store unreachable, a missing extra. Printed as
    one line with exit status 2, like an :class:`AKConfigError`."""


def _started(build: Callable[[], _T]) -> _T:
    """Run one start-up step, turning what makes it fail for good into a :class:`StartupError`.

    Before anything is served a broker or store that cannot be reached is an operator's
    problem to fix, not a traceback to read; later, the same errors are retried.
    """
    try:
        return build()
    except (TransportError, StoreError, ImportError) as exc:
        raise StartupError(str(exc)) from exc


def _configure(args: argparse.Namespace) -> AKConfig:
    """The process's configuration: the file and environment, then the command-line flags.

    It is also published as the process-wide one (:meth:`AKConfig.set`) for agent code that
    reads ``AKConfig.get()``; the components get it passed in. The working folder becomes
    importable first, for the dotted paths it names (an auth validator, a custom transport).
    """
    importable()
    config = AKConfig.load(getattr(args, "config", None))
    api = config.api.model_copy(
        update={
            k: v
            for k, v in (
                ("host", getattr(args, "host", None)),
                ("port", getattr(args, "port", None)),
                ("access_log", getattr(args, "access_log", False) or None),
            )
            if v is not None
        }
    )
    config = config.model_copy(update={"api": api})
    AKConfig.set(config)
    logs.configure(config.logging, getattr(args, "log_level", None))
    return config


def _serve(
    args: argparse.Namespace, with_runner: bool, sockets: list[socket.socket] | None = None
) -> None:
    """``serve`` and ``io``; ``sockets``: already bound by a reloading parent (``--reload``)."""
    from agentkernel.pipeline.runtime.thread_runner import ThreadRunner

    config = _configure(args)
    command = "serve" if with_runner else "io"
    _split_process(command, config)
    if sockets is None:
        _check_port(config.api.host, config.api.port)
    if getattr(args, "reload", False):
        from agentkernel.cli.reload import serve_reloading

        argv = sys.argv[1:] if args.argv is None else args.argv
        serve_reloading(argv, config, args.agents, reloaded_child)
        return
    if with_runner:
        load_agents(args.agents)
    handler = _started(lambda: _io_handler(config, with_runner))
    _summary(command, config)
    ThreadRunner.install_signal_handlers()
    handler.serve(sockets=sockets)


def _io_handler(config: AKConfig, with_runner: bool) -> IOHandler:
    from agentkernel.pipeline.process.io_handler import IOHandler

    handler = IOHandler(config, AgentRegistry.default(), with_runner=with_runner)
    handler.check_startup()
    return handler


def _split_process(command: str, config: AKConfig) -> None:
    """``io`` and ``runner`` share their queues and stores with other processes: refuse the
    per-process in-memory ones, which the other processes (or this one restarted) cannot see."""
    if command == "serve":
        return
    _need_shared(command, "execution.queues.type", config.execution.queues.type, "a broker")
    if command == "io":
        kind = config.execution.response_store.type
        _need_shared(command, "execution.response_store.type", kind, "a response store")
    else:
        _need_shared(command, "session.type", config.session.type, "a session store")


_SHARED_KINDS = {
    "a broker": "sqs, nats, kafka",
    "a response store": "redis, dynamodb",
    "a session store": "redis, dynamodb",
}
_WHY_SHARED = {
    "a broker": "the IO process and the runners would never see each other's messages",
    "a response store": "a reply stored by one IO process could not be read through another, "
    "and a restart would lose the replies",
    "a session store": "two runners would each keep their own state of a session, and a "
    "restart would lose it",
}


def _need_shared(command: str, key: str, kind: str, what: str) -> None:
    if kind != "in_memory":
        return
    raise AKConfigError(
        f"{key}: 'agentkernel {command}' needs {what} shared with the other processes "
        f"({_SHARED_KINDS[what]}), but it is in_memory: {_WHY_SHARED[what]}; set it (see "
        "docs/walkthrough-split.md), or run everything in one process with 'agentkernel serve'"
    )


def _check_port(host: str, port: int) -> None:
    """Fail with one clear line, not a server traceback, when the port is taken."""
    if port == 0:
        return
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror as exc:
            raise AKConfigError(f"api.host: cannot resolve {host!r}: {exc.strerror}") from exc
        except OSError as exc:
            key = "api.host" if exc.errno == errno.EADDRNOTAVAIL else "api.port"
            raise AKConfigError(f"{key}: cannot listen on {host}:{port}: {exc.strerror}") from exc


def _summary(command: str, config: AKConfig) -> None:
    """One start-up line saying what this process is about to run."""
    execution, api = config.execution, config.api
    agents = ", ".join(a.name for a in AgentRegistry.default().agents()) or "none"
    where = "" if command == "runner" else f" on http://{api.host}:{api.port}"
    logging.getLogger("agentkernel.cli.commands").info(
        "agentkernel %s %s%s: agents [%s], transport %s, response store %s, session store %s, "
        "mode %s, auth %s",
        __version__,
        command,
        where,
        agents,
        execution.queues.type,
        execution.response_store.type,
        config.session.type,
        execution.mode,
        "on" if api.auth.enabled else "off",
    )


def _runner(args: argparse.Namespace) -> None:
    from agentkernel.pipeline.runtime.collector import tune_for_server
    from agentkernel.pipeline.runtime.thread_runner import ThreadRunner

    config = _configure(args)
    _split_process("runner", config)
    load_agents(args.agents)
    runner = _started(lambda: _agent_runner(config))
    _summary("runner", config)
    ThreadRunner.install_signal_handlers()
    tune_for_server()  # the process is the runner's
    runner.serve()


def _agent_runner(config: AKConfig) -> AgentRunner:
    from agentkernel.pipeline.process.startup import check_backends
    from agentkernel.pipeline.runner.agent_runner import AgentRunner
    from agentkernel.pipeline.wire.envelope import QueueName

    runner = AgentRunner(config, AgentRegistry.default())
    check_backends(runner.transport, (QueueName.INPUT,), {"session_store": runner.sessions})
    return runner


def _chat(args: argparse.Namespace) -> int:
    from agentkernel.client import ChatClient, ChatError, interactive, one_turn

    client = ChatClient(args.url, args.timeout, api_key=args.api_key, token=args.token)
    extra = {"multitask_strategy": args.strategy} if args.strategy else {}
    try:
        if args.cancel is not None:
            print(client.cancel(args.session, args.cancel))
        elif args.prompt is None:
            print(f"session {args.session}: type a message, end with Ctrl-D", file=sys.stderr)
            interactive(client, args.session, args.agent, stream=args.stream, **extra)
        else:
            one_turn(
                client,
                args.session,
                args.prompt,
                args.agent,
                stream=args.stream,
                asynchronous=args.use_async,
                **extra,
            )
    except ChatError as exc:
        print(f"agentkernel: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentkernel", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"agentkernel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("serve", "run the API, the Agent Runner and the output consumers in one process"),
        ("io", "run the API and the output consumers (IO process)"),
        ("runner", "run the Agent Runner (consumes INPUT)"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        if name != "io":
            cmd.add_argument("agents", help="a .py file or module[:attr] that registers agents")
        if name != "runner":
            cmd.add_argument("--host", help="interface to listen on (api.host)")
            cmd.add_argument("--port", type=_port, help="port to listen on (api.port)")
            cmd.add_argument(
                "--access-log",
                action="store_true",
                help="log one line per request (api.access_log)",
            )
        cmd.add_argument("--config", help="config.yaml to read (default ./config.yaml)")
        if name == "serve":
            cmd.add_argument(
                "--reload",
                action="store_true",
                help="development: restart when a file of the working folder changes",
            )
        cmd.add_argument(
            "--log-level",
            type=str.upper,
            choices=LOG_LEVELS,
            help="lowest level logged (overrides logging.ak.level)",
        )
    chat = sub.add_parser("chat", help="send a chat turn (or, without PROMPT, chat line by line)")
    chat.add_argument("prompt", nargs="?", help="the message; omit it for an interactive session")
    chat.add_argument("--session", required=True, help="session id")
    chat.add_argument("--agent", help="agent name")
    chat.add_argument("--async", dest="use_async", action="store_true", help="enqueue, then poll")
    chat.add_argument("--stream", action="store_true", help="print the reply as it is produced")
    chat.add_argument(
        "--strategy",
        choices=[s.value for s in MultitaskStrategy],
        help="what this turn does to the session's unfinished turns (multitask_strategy)",
    )
    chat.add_argument(
        "--cancel", metavar="REQUEST_ID", help="cancel that turn of the session instead of chatting"
    )
    add_server_options(chat, 60.0, "seconds to wait for the reply")
    cli_sessions.add_parser(sub)
    db_command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    args.argv = argv
    logs.configure(level=getattr(args, "log_level", None))
    try:
        return _dispatch(args)
    except (AKConfigError, StartupError) as exc:
        print(f"agentkernel: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace, sockets: list[socket.socket] | None = None) -> int:
    if args.command == "chat":
        return _chat(args)
    if args.command == "sessions":
        return cli_sessions.run(args)
    if args.command == "db":
        return db_command.run(args)
    if args.command == "runner":
        _runner(args)
    else:
        _serve(args, with_runner=args.command == "serve", sockets=sockets)
    return 0


def reloaded_child(argv: list[str], sockets: list[socket.socket]) -> None:
    """The server process ``serve --reload`` starts (again after each change), on ``sockets``
    its parent bound; ``argv`` is the command line without ``--reload``."""
    args = build_parser().parse_args(argv)
    args.argv = argv
    logs.configure(level=getattr(args, "log_level", None))
    try:
        _dispatch(args, sockets)
    except (AKConfigError, StartupError) as exc:
        print(f"agentkernel: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    sys.exit(main())
