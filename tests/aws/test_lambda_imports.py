"""The serverless public names, and what a Lambda cold start must not load."""

from __future__ import annotations

import subprocess
import sys


def test_the_serverless_names_import_from_their_documented_paths() -> None:
    from agentkernel.auth import AuthValidator, ValidationResult
    from agentkernel.aws import (
        Lambda,
        LambdaSQSConsumer,
        QueueConsumer,
        ResponseHandler,
        ServerlessAgentRunner,
        ServerlessStreamAgentRunner,
        WebsocketConnectionHandler,
    )

    assert issubclass(LambdaSQSConsumer, QueueConsumer)
    assert issubclass(ServerlessStreamAgentRunner, ServerlessAgentRunner)
    assert issubclass(ResponseHandler, LambdaSQSConsumer)
    assert callable(Lambda.handler) and callable(ServerlessAgentRunner.handle)
    validator_class = WebsocketConnectionHandler.set_auth_validator(None)
    assert validator_class is WebsocketConnectionHandler
    assert ValidationResult(True, {"sub": 7}).user_id == "7" and AuthValidator


def test_lambda_handlers_do_not_import_web_frameworks_or_other_brokers() -> None:
    code = (
        "import sys\n"
        "from agentkernel.aws import Lambda, ServerlessAgentRunner, ResponseHandler, "
        "WebsocketConnectionHandler\n"
        "Lambda.handler({'version': '2.0', 'rawPath': '/health', "
        "'requestContext': {'http': {'method': 'GET'}}}, None)\n"
        "heavy = {'fastapi', 'uvicorn', 'starlette', 'nats', 'confluent_kafka', 'redis'}\n"
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
