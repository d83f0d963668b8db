"""The container image's dependency set runs the commands the artifacts give it, without Docker.

A virtual environment gets exactly what the image's build stage installs (a wheel of the project
and the distributions its Dockerfile ``EXTRAS`` require, nothing else), and the files its final
stage copies to ``/app``. Every command of the Dockerfile, the Kubernetes overlays and the ECS
Terraform then runs from there, against moto's SQS and DynamoDB with the fake OpenAI server,
until it answers a turn.

No test run reaches a package index: the wheel is built without build isolation (the ``test``
extra brings setuptools and wheel), and each required distribution is copied, file by file as
its ``RECORD`` lists them, from this test environment, where the ``test`` extra installed it.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import boto3
import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from agentkernel.testing.fake_openai import FakeOpenAI
from tests import servers
from tests.deploy import artifacts as a
from tests.deploy.test_image import image_commands, image_files
from tests.transports.test_sqs import create_fifo

# The first test of a worker to ask for the image pays for building it (a venv, the project's
# wheel, the image's extras) inside its own time: far more than the suite's 120 s per test on a
# slow or loaded machine.
pytestmark = [pytest.mark.aws, pytest.mark.slow, pytest.mark.timeout(600)]

#: The fake model's answer to the example agent's first turn.
FIRST_ANSWER = "[Assistant] You said: hi. (1 messages from you so far.)"


def image_extras() -> str:
    """The extras the build stage installs: the default of its ``ARG EXTRAS``."""
    build = a.dockerfile_stages()[0]
    [extras] = [args.split("=", 1)[1] for i, args in build if i == "ARG" and "EXTRAS=" in args]
    assert re.fullmatch(r"[a-z0-9,]+", extras), extras
    return extras


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory like the image: ``venv/`` with the image's packages, ``app/`` its files."""
    root = tmp_path_factory.mktemp("image")
    venv = root / "venv"
    subprocess.run([servers.PYTHON, "-m", "venv", str(venv)], check=True)
    wheels = root / "wheels"
    # As the build stage does: a wheel of the project, installed with the image's extras.
    pip = [servers.PYTHON, "-m", "pip", "--disable-pip-version-check"]
    build = ["wheel", "-q", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels)]
    subprocess.run([*pip, *build, str(a.ROOT)], check=True, timeout=300)
    [wheel] = wheels.glob("agentkernel-*.whl")
    target = ["--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps"]
    subprocess.run([*pip, *target, str(wheel)], check=True, timeout=300)
    site = Path(
        subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_path('purelib'))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for dist in required(f"agentkernel[{image_extras()}]") - {"agentkernel"}:
        copy_distribution(dist, site, venv / "bin")
    app = root / "app"
    app.mkdir()
    for target, source in image_files().items():
        if target.startswith("/app/"):
            shutil.copy(source, app / Path(target).name)
    return root


def required(requirement: str) -> set[str]:
    """The distributions ``requirement`` needs, itself included, as installed here: its
    ``Requires-Dist`` with the extras asked for, followed to the end."""
    wanted, seen = [Requirement(requirement)], set[tuple[str, frozenset[str]]]()
    names: set[str] = set()
    while wanted:
        req = wanted.pop()
        name, extras = canonicalize_name(req.name), frozenset(req.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        names.add(name)
        for text in metadata.distribution(name).requires or []:
            needed = Requirement(text)
            if needed.marker is None or any(
                needed.marker.evaluate({"extra": extra}) for extra in {"", *extras}
            ):
                wanted.append(needed)
    return names


def copy_distribution(name: str, site: Path, scripts: Path) -> None:
    """Install distribution ``name`` into another environment (``site``, its ``scripts``) by
    copying its files from this one, as its ``RECORD`` lists them; its console scripts are
    written anew for that environment's Python."""
    dist = metadata.distribution(name)
    home = Path(str(dist.locate_file(""))).resolve()
    for file in dist.files or []:
        source = Path(str(dist.locate_file(file))).resolve()
        if source.is_file() and source.is_relative_to(home) and "__pycache__" not in file.parts:
            destination = site / source.relative_to(home)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
    for entry in dist.entry_points.select(group="console_scripts"):
        module, _, attribute = entry.value.partition(":")
        script = scripts / entry.name
        script.write_text(
            f"#!{scripts / 'python'}\nimport sys\nfrom {module} import {attribute.split('.')[0]}\n"
            f"sys.exit({attribute}())\n"
        )
        script.chmod(0o755)


class ImageDeployment:
    """Queues and tables on moto; processes started as the image starts them."""

    def __init__(self, image: Path, model: FakeOpenAI) -> None:
        self.image, self.port = image, servers.free_port()
        self.env = {
            "PATH": f"{image / 'venv' / 'bin'}:/usr/bin:/bin",
            "HOME": str(image),
            **model.env(),
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
            "AK_API__PORT": str(self.port),
        }
        self.procs: list[subprocess.Popen[str]] = []
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)

    def split(self, moto_url: str) -> ImageDeployment:
        """Configure the split topology: SQS queues and DynamoDB tables on moto."""
        tag = uuid.uuid4().hex[:10]
        self.env |= {
            **servers.aws_env(moto_url),
            "AK_EXECUTION__QUEUES__TYPE": "sqs",
            "AK_EXECUTION__QUEUES__INPUT__URL": create_fifo(f"in-{tag}"),
            "AK_EXECUTION__QUEUES__OUTPUT__URL": create_fifo(f"out-{tag}"),
            "AK_EXECUTION__QUEUES__SQS__WAIT_TIME_SECONDS": "1",
            "AK_EXECUTION__RESPONSE_STORE__TYPE": "dynamodb",
            "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME": table(f"r-{tag}", "request_id"),
            "AK_SESSION__TYPE": "dynamodb",
            "AK_SESSION__DYNAMODB__TABLE_NAME": table(f"s-{tag}", "session_id"),
        }
        return self

    def start(self, argv: list[str]) -> subprocess.Popen[str]:
        """Run an image command (``/app/...`` paths are the image's files)."""
        app = self.image / "app"
        args = [str(app / a.removeprefix("/app/")) if a.startswith("/app/") else a for a in argv]
        proc = subprocess.Popen(
            args,
            env=self.env,
            cwd=app,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def answer(self, session: str) -> httpx.Response:
        """Wait for the IO process to be healthy, then run one turn."""
        for _ in range(300):
            assert all(p.poll() is None for p in self.procs), self.stop()
            try:
                if self.client.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        return self.client.post("/api/v1/chat", json={"session_id": session, "prompt": "hi"})

    def healthcheck(self) -> int:
        """Exit code of the image's HEALTHCHECK against the running IO process."""
        return self.start(["python", "/app/healthcheck.py"]).wait(30)

    def stop(self) -> str:
        """SIGTERM every process; returns their stderr (for a failed assertion)."""
        self.client.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        return "\n".join(proc.communicate(timeout=30)[1] for proc in self.procs)


def table(name: str, key: str) -> str:
    boto3.client("dynamodb").create_table(
        TableName=name,
        KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def commands(kind: str) -> list[list[str]]:
    """The distinct commands of the artifacts that start an IO process, a runner, or both."""
    found: list[list[str]] = []
    for argv in image_commands().values():
        role = {"io": "io", "runner": "runner", "serve": "embedded"}.get(argv[1])
        if role is None:
            role = "runner" if "runner" in argv[1] else "io"
        if role == kind and argv not in found:
            found.append(argv)
    return found


@pytest.fixture
def model() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def test_the_image_extras_include_what_the_runner_file_imports() -> None:
    """The runner file the image ships is an OpenAI Agents SDK agent: the image has the SDK."""
    assert "openai" in image_extras().split(",")


def test_every_io_and_runner_command_answers_a_turn(
    image: Path, aws: str, model: FakeOpenAI
) -> None:
    """Each IO command with a runner command (the split topology the artifacts deploy), until
    every distinct command of both kinds has answered a turn."""
    ios, runners = commands("io"), commands("runner")
    assert ["agentkernel", "io"] in ios and ["python", "/app/app_agent_runner.py"] in runners
    for pair in range(max(len(ios), len(runners))):
        io, runner = ios[pair % len(ios)], runners[pair % len(runners)]
        deployment = ImageDeployment(image, model).split(aws)
        try:
            deployment.start(io)
            deployment.start(runner)
            response = deployment.answer("split")
            assert response.status_code == 200, (io, runner, response.text)
            assert response.json()["result"] == FIRST_ANSWER
            assert deployment.healthcheck() == 0
        finally:
            errors = deployment.stop()
        assert all(proc.returncode == 0 for proc in deployment.procs), (io, runner, errors)


def test_the_embedded_command_answers_a_turn(image: Path, model: FakeOpenAI) -> None:
    [serve] = commands("embedded")
    deployment = ImageDeployment(image, model)
    try:
        deployment.start(serve)
        response = deployment.answer("embedded")
        assert response.status_code == 200, response.text
        assert response.json()["result"] == FIRST_ANSWER
    finally:
        errors = deployment.stop()
    assert all(proc.returncode == 0 for proc in deployment.procs), errors


def test_every_transport_of_the_overlays_imports_in_the_image(image: Path) -> None:
    """The overlays run the same commands on NATS and Kafka: their clients are in the image."""
    modules = [
        "agentkernel.pipeline.transport.nats",
        "agentkernel.pipeline.transport.kafka",
        "agentkernel.pipeline.transport.sqs",
        "agentkernel.pipeline.session_store.redis",
        "agentkernel.pipeline.response_store.dynamodb",
        "agentkernel.openai",
    ]
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    python = str(image / "venv" / "bin" / "python")
    done = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
