"""WebSocket pushes through the management API: each failure is one of the project's errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentkernel.aws.responder import ENDPOINT_ENV, ConnectionGone, Pusher
from agentkernel.core.errors import AKConfigError, ResponseStoreError, StoreUnavailableError
from tests.aws.lambda_harness import ManagementAPI

FRAME = {"type": "CHAT_RESPONSE", "request_id": "r1"}


@pytest.fixture
def api(aws: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ManagementAPI]:
    management = ManagementAPI()
    monkeypatch.setenv(ENDPOINT_ENV, management.url)
    yield management
    management.close()


def test_a_frame_reaches_its_connection(api: ManagementAPI) -> None:
    Pusher().post(api.url, "c1", FRAME)
    assert api.wait_for("c1", 1) == [FRAME]


def test_a_gone_connection_is_connection_gone(api: ManagementAPI) -> None:
    api.gone.add("c2")
    with pytest.raises(ConnectionGone):
        Pusher().post(api.url, "c2", FRAME)


def test_a_server_error_is_unavailable_and_retried(api: ManagementAPI) -> None:
    api.failing["c3"] = 500
    with pytest.raises(StoreUnavailableError, match="PostToConnection c3"):
        Pusher().post(api.url, "c3", FRAME)


def test_an_unreachable_endpoint_is_unavailable(aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENDPOINT_ENV, "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(StoreUnavailableError):
        Pusher().post("http://127.0.0.1:1", "c4", FRAME)


def test_no_region_is_a_config_error(api: ManagementAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(AKConfigError, match="no AWS region"):
        Pusher().post(api.url, "c5", FRAME)


def test_a_refused_call_is_a_store_error(api: ManagementAPI) -> None:
    """Neither gone nor a server error: a ResponseStoreError, never botocore's."""
    api.failing["c6"] = 403
    with pytest.raises(ResponseStoreError, match="PostToConnection c6") as caught:
        Pusher().post(api.url, "c6", FRAME)
    assert not isinstance(caught.value, StoreUnavailableError)
