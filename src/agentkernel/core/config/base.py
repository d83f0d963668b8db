"""The base of every configuration block, and the check of a backend's ``type`` key."""

from __future__ import annotations

from pydantic import AfterValidator, BaseModel, ConfigDict


def check_kind(kind: str, builtins: tuple[str, ...], what: str) -> str:
    """A backend ``type``: a built-in name or a dotted path to the user's class.

    Checked when the configuration loads, so a typo fails before the process starts anything.

    Raises:
        ValueError: neither (pydantic reports it under the key).
    """
    if kind in builtins or "." in kind.strip("."):
        return kind
    raise ValueError(
        f"unknown {what} '{kind}'; use one of {', '.join(builtins)} or a dotted path to a class"
    )


def known_kind(what: str, *builtins: str) -> AfterValidator:
    """The validator of a backend ``type`` field (``Annotated[str, known_kind(...)]``): runs
    :func:`check_kind` with these built-in names."""
    return AfterValidator(lambda kind: check_kind(kind, builtins, what))


class Block(BaseModel):
    """A config block: an unknown key is an error (it would silently become the default)."""

    model_config = ConfigDict(extra="forbid")
