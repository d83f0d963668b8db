"""tests/pidfiles.py: the servers of a session that is gone are swept, a live session's are not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests import pidfiles


def test_a_server_is_swept_once_its_owner_is_gone(tmp_path: Path) -> None:
    workdir = tmp_path / "server"
    workdir.mkdir()
    proc = pidfiles.spawn(["sleep", "60"], workdir)
    try:
        pidfiles.sweep()
        assert proc.poll() is None and workdir.exists()  # its owner, this process, is alive
        gone = subprocess.Popen(["true"])
        gone.wait(10)
        record = pidfiles.REGISTRY / f"{proc.pid}.json"
        owner = json.loads(record.read_text()) | {"owner": gone.pid, "owner_start": None}
        record.write_text(json.dumps(owner))  # as if a session killed with SIGKILL had left it
        assert pidfiles.sweep() >= 1
        assert proc.wait(10) < 0  # killed by a signal
        assert not workdir.exists() and not record.exists()
    finally:
        pidfiles.stop(proc, workdir)


def test_stop_kills_the_server_and_removes_its_records(tmp_path: Path) -> None:
    proc = pidfiles.spawn(["sleep", "60"], tmp_path)
    pidfiles.stop(proc, tmp_path)
    assert proc.returncode is not None and not tmp_path.exists()
    assert not (pidfiles.REGISTRY / f"{proc.pid}.json").exists()
