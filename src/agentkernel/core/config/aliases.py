"""The names upstream agentkernel gives the configuration models.

Upstream's transport guide tells users to build ``_QueuesConfig``-shaped blocks; these are
aliases of this package's models, not copies: one class each. They read through the public path
``agentkernel.core.config``.
"""

from __future__ import annotations

from agentkernel.core.config import api, execution, logs, queues, stores

_QueuesConfig = queues.QueuesConfig
_InputQueueConfig = queues.InputQueueSettings
_OutputQueueConfig = queues.OutputQueueSettings
_InMemoryQueueConfig = queues.InMemoryQueueConfig
_NatsQueueConfig = queues.NatsQueueConfig
_KafkaQueueConfig = queues.KafkaQueueConfig
_ResponseStoreConfig = stores.ResponseStoreConfig
_ResponseStoreRedisConfig = stores.ResponseRedisConfig
_ResponseStoreValkeyConfig = stores.ResponseRedisConfig
_ResponseStoreDynamoDBConfig = stores.DynamoDBStoreConfig
_RedisConfig = stores.RedisStoreConfig
_ValkeyConfig = stores.RedisStoreConfig
_DynamoDBConfig = stores.DynamoDBStoreConfig
_SessionStoreConfig = stores.SessionConfig
_ExecutionConfig = execution.ExecutionConfig
_APIConfig = api.ApiConfig
_LoggingConfig = logs.LoggingConfig
_LogLevelConfig = logs.LoggerConfig
