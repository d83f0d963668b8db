"""The real-time HTTP front: Server-Sent Events and WebSocket, beside the REST routes."""
