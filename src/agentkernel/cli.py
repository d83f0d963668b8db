"""The ``agentkernel`` command: wires configuration, agents and entry points together.

    agentkernel serve AGENTS      API + runner + output consumers in one process (embedded)
    agentkernel io                API + output consumers (the containerized IO process)
    agentkernel runner AGENTS     Agent Runner only (the containerized runner process)
    agentkernel chat [PROMPT]     send a turn to a running server and print the reply
                                  (--stream: as it is produced; no PROMPT: interactive)

AGENTS is a ``.py`` file or an importable ``module`` / ``module:attr`` that registers agents.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import runpy
import socket
import sys
from pathlib import Path
from typing import Any

from agentkernel import __version__
from agentkernel import db as db_command
from agentkernel.core.agent import Agent, AgentRegistry, Module
from agentkernel.core.config import AKConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.redact import PrintableFilter


def load_agents(spec: str) -> None:
    """Import the agents named by ``spec`` (a file path or ``module[:attr]``).

    Raises:
        AKConfigError: the file or module cannot be loaded.
    """
    try:
        if spec.endswith(".py") or Path(spec).is_file():
            runpy.run_path(spec, run_name="__agentkernel_agents__")
            return
        module_name, _, attr = spec.partition(":")
        module = importlib.import_module(module_name)
        if attr:
            _register(getattr(module, attr))
    except (OSError, ImportError, AttributeError, SyntaxError, ValueError, TypeError) as exc:
        raise AKConfigError(f"cannot load agents from {spec!r}: {exc}") from exc


def _register(obj: Any) -> None:
    if isinstance(obj, Agent):
        Module([obj])
    elif isinstance(obj, (list, tuple)) and all(isinstance(a, Agent) for a in obj):
        Module(obj)
    elif not isinstance(obj, Module):
        raise AttributeError(f"{obj!r} is not an Agent, a list of agents or a Module")


def _configure(args: argparse.Namespace) -> AKConfig:
    """The process's configuration: the file and environment, then the command-line flags.

    It is also published as the process-wide one (:meth:`AKConfig.set`) for agent code that
    reads ``AKConfig.get()``; the components get it passed in.
    """
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
    logging.getLogger("agentkernel").setLevel(config.logging.ak.level)
    return config


def _serve(args: argparse.Namespace, with_runner: bool) -> None:
    from agentkernel.pipeline.process.io_handler import IOHandler
    from agentkernel.pipeline.process.thread_runner import ThreadRunner

    config = _configure(args)
    if not with_runner:
        _need_a_broker("io", config)
    _check_port(config.api.host, config.api.port)
    if with_runner:
        load_agents(args.agents)
    _summary(args.command, config)
    handler = IOHandler(config, AgentRegistry.default(), with_runner=with_runner)
    ThreadRunner.install_signal_handlers()
    handler.serve()


def _need_a_broker(command: str, config: AKConfig) -> None:
    """The split topology needs a broker both processes reach; in-memory queues are per process,
    so an IO process on them would wait forever for a runner that can never see its turns."""
    if config.execution.queues.type == "in_memory":
        raise AKConfigError(
            f"execution.queues.type: 'agentkernel {command}' needs a broker shared with the other "
            "processes (sqs, nats, kafka), but it is in_memory; set it (see "
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
    logging.getLogger("agentkernel.cli").info(
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
    from agentkernel.pipeline.agent_runner import AgentRunner
    from agentkernel.pipeline.process.thread_runner import ThreadRunner

    config = _configure(args)
    _need_a_broker("runner", config)
    load_agents(args.agents)
    _summary("runner", config)
    runner = AgentRunner(config, AgentRegistry.default())
    ThreadRunner.install_signal_handlers()
    runner.serve()


def _chat(args: argparse.Namespace) -> int:
    from agentkernel.client import ChatClient, ChatError, interactive, one_turn

    client = ChatClient(args.url, args.timeout, api_key=args.api_key, token=args.token)
    try:
        if args.prompt is None:
            print(f"session {args.session}: type a message, end with Ctrl-D", file=sys.stderr)
            interactive(client, args.session, args.agent, stream=args.stream)
        else:
            one_turn(
                client,
                args.session,
                args.prompt,
                args.agent,
                stream=args.stream,
                asynchronous=args.use_async,
            )
    except ChatError as exc:
        print(f"agentkernel: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


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
    db_command.add_parser(sub)
    chat = sub.add_parser("chat", help="send a chat turn (or, without PROMPT, chat line by line)")
    chat.add_argument("prompt", nargs="?", help="the message; omit it for an interactive session")
    chat.add_argument("--session", required=True, help="session id")
    chat.add_argument("--agent", help="agent name")
    chat.add_argument("--async", dest="use_async", action="store_true", help="enqueue, then poll")
    chat.add_argument("--stream", action="store_true", help="print the reply as it is produced")
    chat.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    chat.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the reply")
    chat.add_argument(
        "--api-key",
        default=os.environ.get("AGENTKERNEL_API_KEY"),
        help="API key for a server with authentication on (default $AGENTKERNEL_API_KEY)",
    )
    chat.add_argument(
        "--token",
        default=os.environ.get("AGENTKERNEL_TOKEN"),
        help="bearer token (JWT) for a server with authentication on (default $AGENTKERNEL_TOKEN)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for log_handler in logging.getLogger().handlers:  # one record, one line
        log_handler.addFilter(PrintableFilter())
    try:
        if args.command == "chat":
            return _chat(args)
        if args.command == "db":
            return db_command.run(args)
        if args.command == "runner":
            _runner(args)
        else:
            _serve(args, with_runner=args.command == "serve")
    except AKConfigError as exc:
        print(f"agentkernel: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
