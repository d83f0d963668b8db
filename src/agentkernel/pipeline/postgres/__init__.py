"""What the PostgreSQL stores share: the connection pool and error mapping, the versioned
schema with its migrations, and the sweeper of expired rows (``agentkernel[postgres]``)."""
