"""Response Handler Lambda: OUTPUT batch -> response table, or the client's WebSocket."""

from agentkernel.aws import ResponseHandler

handler = ResponseHandler.handle
