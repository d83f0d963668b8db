"""Every message, record and frame format, each written and read in one module.

A leaf layer: it imports only :mod:`agentkernel.core`.
"""
