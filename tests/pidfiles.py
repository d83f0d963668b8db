"""Server processes a test session starts, each recorded in a pidfile so that none outlives it.

:func:`spawn` starts a server in a process group of its own and writes a pidfile naming it, its
owner (the pytest process that started it) and the temporary directory it lives in; :func:`stop`
kills the group and removes both. A session killed with SIGKILL runs no teardown: the next
session's start calls :func:`sweep`, which kills every recorded server whose owner is gone. On
Linux a server also gets SIGKILL from the kernel when its owner dies (``PR_SET_PDEATHSIG``), so
only an owner stopped in the middle of :func:`spawn` leaves work for the sweep.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: One directory per user, shared by every session of that user on the machine.
REGISTRY = Path(tempfile.gettempdir()) / f"agentkernel-test-servers-{os.getuid()}"

_PR_SET_PDEATHSIG = 1


def _start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, Linux), to tell it from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name before ")" may hold spaces


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, someone else's
    return start is None or _start_time(pid) in (None, start)


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    command: list[str], workdir: Path | None = None, *, log: Path | None = None, **popen: Any
) -> subprocess.Popen[bytes]:
    """Start ``command`` as a server of this process and record it; ``workdir`` (if any) is
    removed with it, ``log`` receives its output.

    ``popen`` are more :class:`subprocess.Popen` arguments (``user``, ``env``...).
    """
    REGISTRY.mkdir(mode=0o700, exist_ok=True)
    output = log.open("ab") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,  # its children (PostgreSQL's backends) die with it
            preexec_fn=_die_with_parent(),
            **popen,
        )
    finally:
        if log is not None:
            output.close()  # type: ignore[union-attr]
    record = {
        "pid": proc.pid,
        "start": _start_time(proc.pid),
        "owner": os.getpid(),
        "owner_start": _start_time(os.getpid()),
        "dir": str(workdir) if workdir is not None else None,
        "command": command[0],
    }
    path = _pidfile(proc.pid)
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").rename(path)  # a sweep never reads half a record
    return proc


def _pidfile(pid: int) -> Path:
    return REGISTRY / f"{pid}.json"


def _kill_group(pid: int, start: str | None) -> None:
    if _alive(pid, start):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def stop(proc: subprocess.Popen[bytes], workdir: Path | None = None) -> None:
    """Kill the server ``proc`` (and its children) and remove its directory and pidfile."""
    if proc.poll() is None:  # once reaped, its pid may be another process's
        _kill_group(proc.pid, None)
    proc.wait(10)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
    _pidfile(proc.pid).unlink(missing_ok=True)


def sweep() -> int:
    """Kill the servers whose owning session is gone; how many pidfiles were swept."""
    swept = 0
    for path in REGISTRY.glob("*.json") if REGISTRY.is_dir() else ():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if _alive(record["owner"], record["owner_start"]):
            continue  # a session running now, maybe another one of this user
        _kill_group(record["pid"], record["start"])
        if record["dir"]:
            shutil.rmtree(record["dir"], ignore_errors=True)
        path.unlink(missing_ok=True)
        swept += 1
    return swept
