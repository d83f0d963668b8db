"""The container image and every command the artifacts run in it."""

from __future__ import annotations

import ast
import http.server
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from agentkernel.cli.commands import build_parser
from tests import servers
from tests.deploy import artifacts as a

LAMBDA_DIR = a.SERVERLESS / "lambda"
# The Lambda entry points of the queue-mode guide (agentkernel.aws, issue 10).
LAMBDA_CONTRACT = {
    ("Lambda", "handler"),
    ("ServerlessAgentRunner", "handle"),
    ("ServerlessStreamAgentRunner", "handle"),
    ("ResponseHandler", "handle"),
    ("WebsocketConnectionHandler", "handler"),
}
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|make|build-essential|python3-dev|cargo|rustc)\b")


def final_stage() -> list[tuple[str, str]]:
    return a.dockerfile_stages()[-1]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"{args} is not exec form: PID 1 would be a shell"
    return [str(v) for v in value]


def image_files() -> dict[str, Path]:
    """Absolute path in the image -> repository file, from the final stage's COPY lines."""
    files: dict[str, Path] = {}
    workdir = "/"
    for instruction, args in final_stage():
        if instruction == "WORKDIR":
            workdir = args
        if instruction == "COPY" and not args.startswith("--from"):
            *sources, target = args.split()
            base = workdir if target in ("./", ".") else target
            for source in sources:
                files[f"{base.rstrip('/')}/{Path(source).name}"] = a.ROOT / source
    return files


def healthcheck_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "ak_healthcheck", a.DEPLOY / "docker" / "healthcheck.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_multi_stage_build_on_one_slim_base() -> None:
    stages = a.dockerfile_stages()
    assert len(stages) >= 2
    bases = {args.split()[0] for stage in stages for i, args in stage if i == "FROM"}
    assert len(bases) == 1, "the venv copied between stages needs the same interpreter path"
    (base,) = bases
    assert "slim" in base and ":" in base and not base.endswith(":latest")


def test_final_stage_is_non_root_without_build_tools() -> None:
    stage = final_stage()
    users = [args for i, args in stage if i == "USER"]
    assert users and int(users[-1].split(":")[0]) >= 10000
    runs = " ".join(args for i, args in stage if i == "RUN")
    assert not BUILD_TOOLS.search(runs)
    assert "pip install" not in runs, "dependencies are installed in the build stage only"
    copies = [args for i, args in stage if i == "COPY" and args.startswith("--from")]
    assert copies == ["--from=build /opt/agentkernel /opt/agentkernel"]


def test_healthcheck_and_command_are_exec_form() -> None:
    stage = final_stage()
    (health,) = [args for i, args in stage if i == "HEALTHCHECK"]
    assert exec_form(health.split(" CMD ", 1)[1]) == ["python", "/app/healthcheck.py"]
    (command,) = [args for i, args in stage if i == "CMD"]
    assert exec_form(command) == ["agentkernel", "io"]
    assert not [i for i, _ in stage if i == "ENTRYPOINT"], "a shell entrypoint would own PID 1"


def image_commands() -> dict[str, list[str]]:
    commands = {"Dockerfile CMD": exec_form(next(x for i, x in final_stage() if i == "CMD"))}
    for name in ("io_command", "runner_command", "embedded_command"):
        commands[f"ecs {name}"] = a.variables(a.ECS)[name]["default"]
    for overlay in a.OVERLAYS:
        for name, deployment in a.objects(overlay, "Deployment").items():
            container = deployment["spec"]["template"]["spec"]["containers"][0]
            commands[f"{overlay} {name}"] = container["command"]
    return commands


def test_every_command_exists_in_the_image() -> None:
    scripts = tomllib.loads((a.ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    subcommands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    files = image_files()
    commands = image_commands()
    assert len(commands) == 1 + 3 + 2 * len(a.OVERLAYS)
    for where, argv in commands.items():
        if argv[0] == "agentkernel":
            assert "agentkernel" in scripts, where
            assert argv[1] in subcommands, where
            if argv[1] in ("runner", "serve"):
                assert argv[2] in files and files[argv[2]].is_file(), where
        else:
            assert argv[0] == "python", where
            assert argv[1] in files and files[argv[1]].is_file(), where


def entry_call(path: Path) -> tuple[str, str]:
    """``(Class, attribute)`` of the entry file's ``if __name__ == "__main__"`` call target."""
    tree = ast.parse(path.read_text())
    assigned = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    value = next(v for v in assigned.values() if isinstance(v, ast.Attribute))
    assert isinstance(value.value, ast.Name)
    return value.value.id, value.attr


def test_ecs_entry_files_start_the_guides_classes() -> None:
    files = image_files()
    io = a.variables(a.ECS)["io_command"]["default"][1]
    runner = a.variables(a.ECS)["runner_command"]["default"][1]
    assert entry_call(files[io]) == ("ECSIOHandler", "run")
    assert entry_call(files[runner]) == ("ECSAgentRunner", "run")
    from agentkernel import aws

    assert callable(aws.ECSIOHandler.run) and callable(aws.ECSAgentRunner.run)


def lambda_handlers() -> dict[str, str]:
    found = {}
    for module in a.MODULES.iterdir():
        for name, var in a.variables(module).items():
            if name in ("handler", "stream_handler") and "default" in var:
                found[f"{module.name}.{name}"] = var["default"]
    return found


def test_lambda_handlers_name_entry_files_with_the_guides_entry_points() -> None:
    handlers = lambda_handlers()
    assert len(handlers) == 5
    seen = set()
    for where, handler in handlers.items():
        file, _, attribute = handler.partition(".")
        path = LAMBDA_DIR / f"{file}.py"
        assert path.is_file(), where
        tree = ast.parse(path.read_text())
        imports = {
            alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module == "agentkernel.aws"
            for alias in node.names
        }
        value = next(
            n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == attribute
        )
        target = (value.value.id, value.attr)
        assert target in LAMBDA_CONTRACT and target[0] in imports, where
        seen.add(target)
    assert seen == LAMBDA_CONTRACT


@pytest.mark.parametrize(
    ("argv", "runner"),
    [
        (["python", "agentkernel", "runner", "app.py"], True),
        (["python", "agentkernel", "io"], False),
        (["python", "agentkernel", "serve", "app_agent_runner.py"], False),
        (["python", "app_agent_runner.py"], True),
        (["python3.12", "-u", "app_rest_service.py"], False),
        (["python", "-m", "agentkernel", "runner", "x.py"], True),
        ([], False),
    ],
)
def test_healthcheck_tells_runner_from_http_processes(argv: list[str], runner: bool) -> None:
    assert healthcheck_module().is_runner(argv) is runner


@pytest.fixture
def health_server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b'{"status": "ok"}')

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join(timeout=5)
    server.server_close()


def test_healthcheck_probes_health(health_server: int) -> None:
    probe = healthcheck_module()
    assert probe.http_health(health_server) is True
    assert probe.http_health(servers.free_port()) is False


def test_healthcheck_reads_the_port_from_the_configuration(
    health_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = healthcheck_module()
    monkeypatch.setattr(probe, "pid1_argv", lambda: ["python", "agentkernel", "io"])
    monkeypatch.setenv("AK_API__PORT", str(health_server))
    assert probe.main() == 0
    monkeypatch.setenv("AK_API__PORT", str(servers.free_port()))
    assert probe.main() == 1
    monkeypatch.setattr(probe, "pid1_argv", lambda: ["python", "agentkernel", "runner", "a.py"])
    assert probe.main() == 0  # a runner without a health port: its exit is the signal


def test_healthcheck_probes_a_runners_health_port(
    health_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = healthcheck_module()
    monkeypatch.setattr(probe, "pid1_argv", lambda: ["python", "app_agent_runner.py"])
    monkeypatch.setenv("AK_API__PORT", str(servers.free_port()))
    monkeypatch.setenv("AK_EXECUTION__RUNNER__HEALTH_PORT", str(health_server))
    assert probe.main() == 0
    monkeypatch.setenv("AK_EXECUTION__RUNNER__HEALTH_PORT", str(servers.free_port()))
    assert probe.main() == 1


def test_the_image_turns_the_runners_health_port_on() -> None:
    (env,) = [args for i, args in final_stage() if i == "ENV"]
    assert "AK_EXECUTION__RUNNER__HEALTH_PORT=8001" in env
    assert "AK_EXECUTION__RUNNER__HEALTH_HOST=0.0.0.0" in env
    (exposed,) = [args for i, args in final_stage() if i == "EXPOSE"]
    assert "8001" in exposed.split()


def test_the_embedded_command_serves_health_and_drains_on_sigterm(tmp_path: Path) -> None:
    """The ECS embedded command, run as the image runs it (exec form: the process gets SIGTERM
    itself): the health probe passes, and SIGTERM ends it with status 0."""
    argv = a.variables(a.ECS)["embedded_command"]["default"]
    files = image_files()
    agentkernel = shutil.which("agentkernel", path=str(Path(sys.executable).parent))
    assert argv[0] == "agentkernel" and agentkernel is not None
    command = [agentkernel, *(str(files.get(arg, arg)) for arg in argv[1:])]
    port = servers.free_port()
    env = {**os.environ, "AK_API__PORT": str(port), "PYTHONPATH": str(a.ROOT / "src")}
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=sink)
    try:
        probe = healthcheck_module()
        deadline = time.monotonic() + 20
        while not probe.http_health(port):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the server did not answer /health"
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
