"""Which webhook URLs may be called: checked when a turn is accepted and again before each POST.

A URL passes when it is short, plain (no credentials, no whitespace or non-ASCII), ``https`` (or
``http`` to loopback under the development switch), names a host that ``allowed_hosts`` lets
through, and that host is, or resolves only to, addresses a server should call out to: public
ones, plus those ``allowed_networks`` names. Loopback, private, link-local (the cloud metadata
service at 169.254.169.254), multicast, reserved and unspecified addresses are refused, in IPv4
and IPv6 alike, including an IPv4 address carried inside an IPv6 one (mapped, 6to4, Teredo,
NAT64). The sender connects to an address this check returned, never to a second resolution of
the name, so a name that changes its answer between the check and the call (DNS rebinding)
cannot steer it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agentkernel.core.config.webhooks import WebhooksConfig

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Longest webhook URL accepted, in characters.
MAX_URL_LENGTH = 2048
#: Seconds the front waits for a webhook host's name to resolve.
RESOLVE_TIMEOUT_SECONDS = 3.0
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-_")


class WebhookRefused(Exception):
    """A webhook URL that may not be called.

    Attributes:
        reason: a short code for the rule it broke (``scheme``, ``credentials``, ``too_long``,
            ``malformed``, ``host_not_allowed``, ``address_not_allowed``, ``unresolvable``).
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Target:
    """A webhook URL taken apart: what the sender connects to and asks for."""

    scheme: str
    host: str  # lower case, no brackets, no trailing dot
    port: int
    path: str  # path and query, at least "/"

    @property
    def literal(self) -> IPAddress | None:
        """The host as an IP address when the URL names one."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def parse(url: object, config: WebhooksConfig) -> Target:
    """Check a webhook URL's form and host name against ``config`` (no name resolution).

    Raises:
        WebhookRefused: the URL breaks a rule.
    """
    if not isinstance(url, str):
        raise WebhookRefused("malformed", "the webhook must be a string")
    if len(url) > MAX_URL_LENGTH:
        raise WebhookRefused("too_long", f"the webhook URL is longer than {MAX_URL_LENGTH} chars")
    if not url.isascii() or not url.isprintable() or " " in url:
        raise WebhookRefused("malformed", "the webhook URL holds whitespace or non-ASCII")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused("malformed", f"the webhook URL is malformed: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http") or (scheme == "http" and not config.allow_http_loopback):
        allowed = "https (or http to loopback in development)"
        raise WebhookRefused("scheme", f"the webhook URL must use {allowed}")
    if "@" in parts.netloc:
        raise WebhookRefused("credentials", "the webhook URL must not carry credentials")
    host = _host(parts.hostname or "")
    if not allowed_host(host, config.allowed_hosts):
        raise WebhookRefused(
            "host_not_allowed", f"webhook host {host!r} is not in api.webhooks.allowed_hosts"
        )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(scheme, host, port or (443 if scheme == "https" else 80), path)


def _host(host: str) -> str:
    host = host.lower().removesuffix(".")
    if not host:
        raise WebhookRefused("malformed", "the webhook URL names no host")
    if ":" in host:  # only an IPv6 literal has one (the port was split off)
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise WebhookRefused("malformed", f"bad IPv6 host in webhook URL: {exc}") from exc
    elif not set(host) <= _HOST_CHARS:
        raise WebhookRefused("malformed", f"webhook host {host!r} is not a valid host name")
    return host


def allowed_host(host: str, patterns: list[str]) -> bool:
    """Whether ``host`` matches an ``allowed_hosts`` pattern (``*``, exact, ``*.domain``)."""
    for pattern in patterns:
        pattern = pattern.strip("[]").removesuffix(".")
        if pattern == "*" or pattern == host:
            return True
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return True
    return False


def refusal(address: IPAddress) -> str | None:
    """Why a server should not call ``address`` (``loopback``, ``private``, ...), or ``None``."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return refusal(address.ipv4_mapped)  # the same endpoint as the IPv4 address
    kinds = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("non-public", not address.is_global),
    )
    for kind, matches in kinds:
        if matches:
            return kind
    inner = _embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
    return None if inner is None else refusal(inner)


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a 6to4, Teredo or NAT64 address leads to, if any."""
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def check_addresses(target: Target, addresses: list[IPAddress], config: WebhooksConfig) -> None:
    """Refuse unless every address ``target``'s host stands for may be called.

    Raises:
        WebhookRefused: ``address_not_allowed`` naming the first address refused and why.
    """
    if not addresses:
        raise WebhookRefused("unresolvable", f"webhook host {target.host!r} has no address")
    for address in addresses:
        why = _refused(address, target.scheme, config)
        if why is not None:
            shown = target.host if target.literal else f"{target.host!r} resolves to {address},"
            raise WebhookRefused(
                "address_not_allowed",
                f"webhook host {shown} {why}; refused (api.webhooks.allowed_networks may allow it)",
            )


def _refused(address: IPAddress, scheme: str, config: WebhooksConfig) -> str | None:
    plain = address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        plain = address.ipv4_mapped
    loopback = plain.is_loopback
    if scheme == "http":  # the development switch: loopback only
        return None if loopback else "is not a loopback address, which http requires"
    if loopback and config.allow_http_loopback:
        return None
    if any(plain in network for network in config.allowed_networks):
        return None
    kind = refusal(address)
    return None if kind is None else f"is a {kind} address"


def resolve(target: Target) -> list[IPAddress]:
    """Every address of ``target``'s host, in the resolver's order (blocks; delivery threads).

    Raises:
        WebhookRefused: ``unresolvable``.
    """
    if (literal := target.literal) is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise WebhookRefused("unresolvable", f"webhook host {target.host!r}: {exc}") from exc
    return _addresses(infos)


async def resolve_async(
    target: Target, timeout: float = RESOLVE_TIMEOUT_SECONDS
) -> list[IPAddress]:
    """:func:`resolve` without blocking the event loop, within ``timeout`` seconds.

    Raises:
        WebhookRefused: ``unresolvable`` (no answer in time, or none at all).
    """
    if (literal := target.literal) is not None:
        return [literal]
    loop = asyncio.get_running_loop()
    lookup = loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    try:
        infos = await asyncio.wait_for(lookup, timeout)
    except (OSError, UnicodeError, TimeoutError) as exc:
        why = str(exc) or "no answer in time"
        raise WebhookRefused("unresolvable", f"webhook host {target.host!r}: {why}") from exc
    return _addresses(infos)


def _addresses(infos: Sequence[tuple[Any, ...]]) -> list[IPAddress]:
    found: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])  # drop an IPv6 zone
        if address not in found:
            found.append(address)
    return found


async def check_url(url: object, config: WebhooksConfig) -> Target:
    """The front's whole check of a webhook URL: its form, its host, every address of it.

    Raises:
        WebhookRefused: the URL may not be called.
    """
    target = parse(url, config)
    check_addresses(target, await resolve_async(target), config)
    return target


def checked_addresses(url: str, config: WebhooksConfig) -> tuple[Target, list[IPAddress]]:
    """The same check at delivery time (blocking): the target and the addresses to connect to.

    Raises:
        WebhookRefused: the URL may not be called (any more).
    """
    target = parse(url, config)
    addresses = resolve(target)
    check_addresses(target, addresses, config)
    return target, addresses
