"""Process machinery every component may use: event-loop thread, thread runner, metrics, tracing.

A leaf layer: it imports only :mod:`agentkernel.core`.
"""
