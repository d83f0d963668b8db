"""Which webhook URLs pass: each rule, each class of internal address, v4 and v6."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from agentkernel.core.config.webhooks import WebhooksConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.webhooks.urls import (
    MAX_URL_LENGTH,
    WebhookRefused,
    check_addresses,
    check_url,
    parse,
    refusal,
)

OPEN = WebhooksConfig(secret="s", allowed_hosts=["*"])
DEV = WebhooksConfig(secret="s", allowed_hosts=["*"], allow_http_loopback=True)

#: Addresses a server must not call by default, and the kind each is refused as.
INTERNAL = [
    ("127.0.0.1", "loopback"),
    ("127.3.4.5", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local"),  # the cloud metadata service
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "private"),  # reserved (240/4): Python files it under private too
    ("255.255.255.255", "private"),
    ("0.0.0.0", "unspecified"),
    ("100.64.0.1", "non-public"),  # carrier-grade NAT
    ("192.0.2.10", "private"),  # documentation range
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link-local"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "loopback"),  # v4-mapped
    ("::ffff:169.254.169.254", "link-local"),
    ("::ffff:10.0.0.1", "private"),
    ("2002:7f00:1::", "loopback"),  # 6to4 around 127.0.0.1
    ("2002:a9fe:a9fe::", "link-local"),  # 6to4 around 169.254.169.254
    ("64:ff9b::a00:1", "reserved"),  # NAT64 (inside ::/8, reserved, whatever it wraps)
    ("2001:db8::1", "private"),  # documentation range
]


@pytest.mark.parametrize(("address", "kind"), INTERNAL)
def test_internal_addresses_are_refused_by_kind(address: str, kind: str) -> None:
    assert refusal(ipaddress.ip_address(address)) == kind


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2606:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(("address", "kind"), INTERNAL)
def test_an_internal_ip_literal_url_is_refused(address: str, kind: str) -> None:
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(WebhookRefused) as caught:
        asyncio.run(check_url(f"https://{host}/hook", OPEN))
    assert caught.value.reason == "address_not_allowed"
    assert kind in str(caught.value)


def test_a_name_that_resolves_to_loopback_is_refused() -> None:
    with pytest.raises(WebhookRefused) as caught:
        asyncio.run(check_url("https://localhost:8443/hook", OPEN))
    assert caught.value.reason == "address_not_allowed"
    assert "'localhost' resolves to" in str(caught.value) and "loopback" in str(caught.value)


def test_a_public_literal_passes_the_whole_check() -> None:
    target = asyncio.run(check_url("https://8.8.8.8:8443/a/b?x=1#frag", OPEN))
    assert (target.scheme, target.host, target.port, target.path) == (
        "https",
        "8.8.8.8",
        8443,
        "/a/b?x=1",
    )


def test_allowed_networks_let_an_internal_receiver_in() -> None:
    config = WebhooksConfig(secret="s", allowed_hosts=["*"], allowed_networks=["10.20.0.0/16"])
    assert asyncio.run(check_url("https://10.20.1.2/hook", config)).host == "10.20.1.2"
    with pytest.raises(WebhookRefused):
        asyncio.run(check_url("https://10.21.1.2/hook", config))
    with pytest.raises(WebhookRefused):  # the v4-mapped form of an address outside it
        asyncio.run(check_url("https://[::ffff:169.254.169.254]/hook", config))


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://example.com/x", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("//example.com/x", "scheme"),
        ("", "scheme"),
        ("http://example.com/x", "scheme"),  # http needs the development switch
        ("https://user:pw@example.com/x", "credentials"),
        ("https://token@example.com/x", "credentials"),
        ("https://example.com:99999/x", "malformed"),
        ("https://example.com:port/x", "malformed"),
        ("https:///x", "malformed"),
        ("https://exa mple.com/x", "malformed"),
        ("https://exämple.com/x", "malformed"),
        ("https://example.com/\x00", "malformed"),
        ("https://example.com/\r\nX-Injected: 1", "malformed"),
        ("https://ex$ample.com/x", "malformed"),
        ("https://[::1/x", "malformed"),
        ("https://example.com/" + "a" * MAX_URL_LENGTH, "too_long"),
    ],
)
def test_malformed_urls_are_refused_with_a_reason(url: str, reason: str) -> None:
    with pytest.raises(WebhookRefused) as caught:
        parse(url, OPEN)
    assert caught.value.reason == reason, caught.value


@pytest.mark.parametrize("value", [1, 1.5, True, ["https://example.com"], {"url": "x"}, None])
def test_a_webhook_that_is_not_a_string_is_refused(value: object) -> None:
    with pytest.raises(WebhookRefused) as caught:
        parse(value, OPEN)
    assert caught.value.reason == "malformed"


@pytest.mark.parametrize(
    ("patterns", "host", "allowed"),
    [
        ([], "example.com", False),
        (["*"], "example.com", True),
        (["hooks.example.com"], "hooks.example.com", True),
        (["hooks.example.com"], "HOOKS.Example.com.", True),
        (["hooks.example.com"], "other.example.com", False),
        (["*.example.com"], "a.b.example.com", True),
        (["*.example.com"], "example.com", False),
        (["*.example.com"], "evilexample.com", False),
        (["*.example.com"], "example.com.evil.net", False),
        (["[2606:4700::1111]"], "2606:4700::1111", True),
    ],
)
def test_the_allow_list(patterns: list[str], host: str, allowed: bool) -> None:
    config = WebhooksConfig(secret="s", allowed_hosts=patterns)
    url = f"https://[{host}]/x" if ":" in host else f"https://{host}/x"
    if allowed:
        assert parse(url, config).host == host.lower().rstrip(".")
    else:
        with pytest.raises(WebhookRefused) as caught:
            parse(url, config)
        assert caught.value.reason == "host_not_allowed"


def test_http_goes_to_loopback_only_and_only_under_the_switch() -> None:
    target = parse("http://127.0.0.1:9/x", DEV)
    check_addresses(target, [ipaddress.ip_address("127.0.0.1")], DEV)
    for address in ("8.8.8.8", "10.0.0.1"):
        with pytest.raises(WebhookRefused) as caught:
            check_addresses(target, [ipaddress.ip_address(address)], DEV)
        assert "loopback" in str(caught.value)
    with pytest.raises(WebhookRefused):  # one bad address spoils a name (rebinding)
        addresses = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.0.0.1")]
        check_addresses(target, addresses, DEV)


def test_bad_allow_list_patterns_stop_the_config() -> None:
    for pattern in ("*.*.example.com", "exa mple.com", "a*b.com", "https://example.com"):
        with pytest.raises(ValueError):
            WebhooksConfig(allowed_hosts=[pattern])


def test_config_keys_load_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentkernel.core.config.root import AKConfig

    monkeypatch.setenv("AK_API__WEBHOOKS__SECRET", "from-env")
    monkeypatch.setenv("AK_API__WEBHOOKS__ALLOWED_HOSTS", '["*.example.com"]')
    monkeypatch.setenv("AK_API__WEBHOOKS__MAX_DELIVERY_SECONDS", "30")
    webhooks = AKConfig.load().api.webhooks
    assert webhooks.secret is not None and webhooks.secret.get_secret_value() == "from-env"
    assert webhooks.allowed_hosts == ["*.example.com"] and webhooks.max_delivery_seconds == 30
    monkeypatch.setenv("AK_API__WEBHOOKS__ALLOWED_NETWORKS", '["10.0.0.300/8"]')
    with pytest.raises(AKConfigError, match="allowed_networks"):
        AKConfig.load()
