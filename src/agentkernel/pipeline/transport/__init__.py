"""Queue transports: one broker per module, all behind :mod:`.base`."""
