"""docs/migrating.md names every upstream name, config key and route this package maps."""

from __future__ import annotations

import re
from pathlib import Path

import agentkernel.pipeline
import agentkernel.pipeline.transport
from agentkernel.core.config import aliases  # upstream's underscore names
from agentkernel.core.upstream import UPSTREAM_MOVED, UPSTREAM_ONLY

DOC = (Path(__file__).resolve().parents[2] / "docs" / "migrating.md").read_text()


def test_every_upstream_config_key_handled_here_is_in_the_guide() -> None:
    for path in UPSTREAM_ONLY:
        assert f"`{'.'.join(path)}`" in DOC, path
    for path in UPSTREAM_MOVED:  # written as `session.redis.ttl`, `.valkey.ttl`, ...
        assert f"{'.'.join(path[-2:])}`" in DOC and ".".join(path[:2]) in DOC, path


def test_every_upstream_name_aliased_here_is_in_the_guide() -> None:
    underscore = [name for name in vars(aliases) if re.fullmatch(r"_[A-Z]\w+Config", name)]
    assert len(underscore) >= 18
    exported = [*agentkernel.pipeline.__all__, *agentkernel.pipeline.transport.__all__]
    for name in [*underscore, *exported, "ExecutionMode", "RESTRequestHandler"]:
        assert name in DOC, name


def test_the_routes_and_links_of_the_guide_exist() -> None:
    for route in ("GET /api/v1/chat?request_id=", "GET /api/v1/agents", "upstream_prefix"):
        assert route in DOC
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^## (.+)$", DOC, re.MULTILINE)
    }
    for link in re.findall(r"\]\(#([^)]+)\)", DOC):
        assert link in anchors, link
    for page in re.findall(r"\]\(([a-z-]+\.md)\)", DOC):
        assert (Path(__file__).resolve().parents[2] / "docs" / page).is_file(), page
