"""Helpers for testing agents built on agentkernel.

- :mod:`agentkernel.testing.fake_openai`: a local OpenAI-compatible model server with
  deterministic, conversation-dependent answers and switchable failures.

Nothing here imports an agent SDK.
"""
