"""Rules proved on every front at once (FastAPI, /ws, Lambda HTTP and WebSocket); they need the
optional extras, so CI's core-only stage leaves them out."""
