"""Request Handler Lambda: API Gateway (HTTP and WebSocket chat frames) -> INPUT queue."""

from agentkernel.aws import Lambda

handler = Lambda.handler
