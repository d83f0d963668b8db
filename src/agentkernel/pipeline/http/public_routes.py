"""Service routes that may be served without a credential while authentication is on
(``api.limits.public_routes``): a Prometheus scraper or a documentation reader can be let in
without being given a key that opens the chat API."""

from __future__ import annotations

from collections.abc import Iterable

from agentkernel.core.config.limits import PublicRoute

__all__ = ["PATHS", "public_paths"]

#: The paths each public route name opens.
PATHS: dict[PublicRoute, frozenset[str]] = {
    "metrics": frozenset({"/metrics"}),
    "docs": frozenset({"/docs", "/docs/oauth2-redirect", "/openapi.json"}),
}


def public_paths(routes: Iterable[PublicRoute]) -> frozenset[str]:
    """Every path opened by ``routes``."""
    return frozenset().union(*(PATHS[route] for route in routes))
