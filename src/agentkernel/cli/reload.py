"""``agentkernel serve --reload``: restart the server when a file changes (development only).

uvicorn's reloader (``uvicorn.supervisors.ChangeReload``) stays in the parent process: it binds
the port once, watches the working folder and the agents file's folder, and starts a fresh
child process on every change. A reloaded app cannot be handed over as an object (the child is
a new interpreter), so the child rebuilds the whole process from the command line:
:func:`agentkernel.cli.commands.reloaded_child` parses it again (without ``--reload``), loads the
configuration and the agents, and serves on the parent's socket. A child that fails to start
(a syntax error in the agents file) prints its one-line error; the next change starts another.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn
from uvicorn.supervisors import ChangeReload

from agentkernel.core.config.root import AKConfig
from agentkernel.core.loading import importable, is_agents_file

__all__ = ["serve_reloading"]


def serve_reloading(
    argv: list[str],
    config: AKConfig,
    agents: str,
    child: Callable[[list[str], list[socket.socket]], None],
) -> None:
    """Watch for changes and run the server in a child process, restarted on each one.

    Args:
        argv: the ``agentkernel`` command line (``--reload`` is dropped for the child).
        config: the configuration, for where to listen.
        agents: the agents file or module, whose folder is watched too.
        child: what the child process runs, with the command line and the bound sockets.
    """
    folders = [Path.cwd()]
    if is_agents_file(agents):
        folders.append(Path(agents).resolve().parent)
        importable(Path(agents))  # the child starts with this process's sys.path
    else:
        importable()
    child_argv = [arg for arg in argv if arg != "--reload"]
    settings = uvicorn.Config(
        "agentkernel.cli.commands:reloaded_child",  # never imported here: the child runs the target
        host=config.api.host,
        port=config.api.port,
        reload=True,
        reload_dirs=sorted({str(folder) for folder in folders}),
        log_config=None,
    )
    sockets = [settings.bind_socket()]
    target = functools.partial(child, child_argv)
    ChangeReload(settings, target=target, sockets=sockets).run()
