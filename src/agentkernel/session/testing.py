"""The session store contract suite under its first import path (see
:mod:`agentkernel.pipeline.session_store.testing`)."""

from agentkernel.pipeline.session_store.testing import SessionStoreContract

__all__ = ["SessionStoreContract"]
