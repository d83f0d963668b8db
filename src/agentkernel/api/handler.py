"""The base class upstream code derives extra REST handlers from.

Such a handler is passed to ``ECSIOHandler.run(handlers=[...])`` (or ``IOHandler.run``): its
router is served beside the API's own routes, behind the same authentication.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from fastapi import APIRouter

__all__ = ["RESTRequestHandler"]


class RESTRequestHandler(ABC):
    """Extra routes for the HTTP API: implement :meth:`get_router`."""

    @abstractmethod
    def get_router(self) -> APIRouter:
        """The router holding this handler's routes (paths as they are served)."""
