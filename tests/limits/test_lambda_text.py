"""The Lambda front refuses a lone surrogate like the HTTP one (issue 24, item 8)."""

from __future__ import annotations

import json

import pytest

from agentkernel.aws import Lambda
from tests.aws.lambda_harness import LambdaContext, http_v2, sqs_event
from tests.aws.test_lambda import Deployment, d  # noqa: F401 - fixture

pytestmark = pytest.mark.aws


@pytest.mark.parametrize(
    "body",
    [
        '{"session_id": "s", "prompt": "hi", "note": "\\ud800"}',  # escaped in the body text
        '{"session_id": "s", "prompt": "hi", "note": "\ud800"}',  # a literal one in the event
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(d: Deployment, body: str) -> None:  # noqa: F811
    event = http_v2("POST", "/api/v1/chat", body, headers={"prefer": "respond-async"})
    response = Lambda.handler(event, LambdaContext())
    doc = json.loads(response["body"])
    assert (response["statusCode"], doc["error"], doc["field"]) == (400, "INVALID_TEXT", "note")
    assert sqs_event(d.input, wait=0)["Records"] == []
