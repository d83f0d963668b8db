"""An IO container entry file as an upstream user writes it: a token validator and an extra
REST handler handed to ``ECSIOHandler.run`` (configured by environment variables only)."""

from fastapi import APIRouter

from agentkernel.api.handler import RESTRequestHandler
from agentkernel.auth import AuthValidator, ValidationResult
from agentkernel.aws import ECSIOHandler


class StaticTokens(AuthValidator):
    def validate(self, token, context=None):  # type: ignore[no-untyped-def]
        if token == "good-token":
            return ValidationResult(is_valid=True, claims={"sub": "alice"})
        return ValidationResult(is_valid=False, error_msg="unknown token")


class StatusHandler(RESTRequestHandler):
    def status(self):  # type: ignore[no-untyped-def]
        return {"status": "custom"}

    def get_router(self):  # type: ignore[no-untyped-def]
        router = APIRouter()
        router.add_api_route("/app/status", self.status, methods=["GET"])
        return router


if __name__ == "__main__":
    ECSIOHandler.run(auth_validator=StaticTokens(), handlers=[StatusHandler()])
