"""WebSocket connection handler Lambda: $connect stores the connection, $disconnect removes it."""

from agentkernel.aws import WebsocketConnectionHandler

handler = WebsocketConnectionHandler.handler
