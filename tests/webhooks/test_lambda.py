"""Webhooks on the serverless topology: moto's SQS and DynamoDB, the Lambda handlers, a local
receiver. The response handler function returns only once its webhooks are sent."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agentkernel.aws import Lambda, ResponseHandler, ServerlessAgentRunner
from agentkernel.webhooks import SIGNATURE_HEADER, verify_signature
from tests.aws.lambda_harness import LambdaContext, http_v2, pump, websocket
from tests.aws.test_lambda import Deployment, body_of, chat, connect
from tests.aws.test_lambda import d as d  # the deployment fixture
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.aws

SECRET = "lambda-secret"


@pytest.fixture
def hooks(d: Deployment, monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    for key, value in {
        "AK_API__WEBHOOKS__SECRET": SECRET,
        "AK_API__WEBHOOKS__ALLOWED_HOSTS": '["127.0.0.1"]',
        "AK_API__WEBHOOKS__ALLOW_HTTP_LOOPBACK": "true",
        "AK_API__WEBHOOKS__RETRY_DELAY": "0.1",
    }.items():
        monkeypatch.setenv(key, value)
    receiver = Receiver([500, 200])
    yield receiver
    receiver.close()


def test_the_response_function_posts_and_retries_before_it_returns(
    d: Deployment, hooks: Receiver
) -> None:
    body = chat("lw", "one") | {"webhook": hooks.url}
    event = http_v2("POST", "/api/v1/chat", body, headers={"prefer": "respond-async"})
    accepted = Lambda.handler(event, LambdaContext())
    assert accepted["statusCode"] == 202
    d.run_turns()
    assert len(hooks.received) == 2  # no wait: the invocation waited for both attempts
    doc = json.loads(hooks.received[1].body)
    verify_signature(hooks.received[1].body, hooks.received[1].headers[SIGNATURE_HEADER], SECRET)
    assert doc["request_id"] == body_of(accepted)["request_id"]
    assert (doc["status_code"], json.loads(doc["body"]["result"])) == (200, ["one"])


def test_a_streamed_websocket_turn_fits_sqs_and_posts_once(d: Deployment, hooks: Receiver) -> None:
    """The fullest reply: connection, endpoint, client id, stream, user, trace, status and the
    webhook on one SQS message."""
    hooks.statuses = [200]
    connect("conn-w")
    frame = {"route": "chat", "request_id": "client-42", "body": chat("lws", "a b c", "words")}
    frame["body"] |= {"stream": True, "webhook": hooks.url}
    queued = body_of(Lambda.handler(websocket("MESSAGE", "conn-w", frame)))
    assert queued["type"] == "CHAT_QUEUED"
    pump(d.input, ServerlessAgentRunner.handle)
    pump(d.output, ResponseHandler.handle, rounds=3)
    frames = d.management.wait_for("conn-w", 4)
    assert frames[-1]["done"] is True
    assert len(hooks.received) == 1
    assert json.loads(hooks.received[0].body)["body"]["result"] == "a b c "


def test_the_lambda_fronts_refuse_an_internal_webhook(
    d: Deployment, hooks: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AK_API__WEBHOOKS__ALLOWED_HOSTS", '["*"]')  # the address rule still holds
    metadata = "https://169.254.169.254/latest/meta-data/"
    connect("conn-r")
    frame = {"route": "chat", "body": chat("lr", "x") | {"webhook": metadata}}
    refused = body_of(Lambda.handler(websocket("MESSAGE", "conn-r", frame)))
    assert (refused["type"], refused["error"]) == ("SYSTEM_RESPONSE", "INVALID_WEBHOOK")
    event = http_v2("POST", "/api/v1/chat", chat("lr", "x") | {"webhook": metadata})
    answer = Lambda.handler(event, LambdaContext())
    assert answer["statusCode"] == 400 and body_of(answer)["reason"] == "address_not_allowed"
