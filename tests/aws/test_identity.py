"""Which caller identity the Lambda request handler reads from an API Gateway event."""

from __future__ import annotations

from typing import Any

import pytest

from agentkernel.aws.events import authorized_identity, parse_api_event
from tests.aws.lambda_harness import http_v2, rest_v1, websocket


@pytest.mark.parametrize(
    ("authorizer", "identity"),
    [
        (None, None),
        ({"jwt": {"claims": {"sub": "alice"}, "scopes": None}}, "jwt:alice"),
        (
            {"jwt": {"claims": {"sub": "alice", "iss": "https://idp.test/"}}},
            "jwt:https%3A//idp.test/:alice",
        ),
        ({"jwt": {"claims": {"sub": "a:b"}}}, "jwt:a%3Ab"),  # ':' never fakes an issuer
        ({"jwt": {"claims": {}}, "principalId": "ignored"}, None),
        ({"principalId": "bob"}, "lambda:bob"),
        ({"claims": {"sub": "carol"}}, "jwt:carol"),
        (
            {"claims": {"sub": "carol", "iss": "https://cognito.test/pool"}},
            "jwt:https%3A//cognito.test/pool:carol",
        ),
        ({"lambda": {"user": "dave"}}, None),
        ({"principalId": ""}, None),
        ("not a dict", None),
    ],
)
def test_authorized_identity(authorizer: Any, identity: str | None) -> None:
    context = {} if authorizer is None else {"authorizer": authorizer}
    assert authorized_identity(context) == identity


def test_every_event_shape_carries_the_identity() -> None:
    for event in (http_v2("GET", "/x"), rest_v1("GET", "/x"), websocket("MESSAGE", "c1", {})):
        event["requestContext"]["authorizer"] = {"principalId": "erin"}
        assert parse_api_event(event).identity == "lambda:erin"
