"""The deployment pages point at files that exist and say how to tear down what they create."""

from __future__ import annotations

import re

import pytest

from tests.deploy import artifacts as a

PAGES = ("deploy-docker.md", "deploy-serverless.md", "deploy-ecs.md", "deploy-kubernetes.md")


@pytest.mark.parametrize("page", PAGES)
def test_every_deploy_path_named_exists(page: str) -> None:
    text = (a.ROOT / "docs" / page).read_text()
    paths = set(re.findall(r"(?<![\w/])deploy/(?:docker|terraform|k8s)\b[\w./-]*[\w/]", text))
    assert paths, page
    for path in paths:
        assert (a.ROOT / path).exists(), f"{page} names {path}, which does not exist"


@pytest.mark.parametrize("page", PAGES[1:])
def test_deploy_and_tear_down_commands_are_given(page: str) -> None:
    text = (a.ROOT / "docs" / page).read_text()
    sections = re.split(r"^## ", text, flags=re.MULTILINE)
    titles = {s.split("\n", 1)[0]: s for s in sections[1:]}
    assert "```bash" in titles["Deploy"]
    assert re.search(r"(terraform destroy|kubectl delete -k)", titles["Tear down"])


def test_readme_links_every_deploy_page() -> None:
    readme = (a.ROOT / "README.md").read_text()
    for page in PAGES:
        assert f"(docs/{page})" in readme
