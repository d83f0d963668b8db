"""The names upstream agentkernel gives the configuration models.

Upstream's transport guide tells users to build ``_QueuesConfig``-shaped blocks; these are
aliases of this package's models, not copies: one class each. They read through the public path
``agentkernel.core.config``.
"""

from __future__ import annotations

from agentkernel.core.config.api import ApiConfig
from agentkernel.core.config.execution import ExecutionConfig
from agentkernel.core.config.logs import LoggerConfig, LoggingConfig
from agentkernel.core.config.queues import (
    InMemoryQueueConfig,
    InputQueueSettings,
    KafkaQueueConfig,
    NatsQueueConfig,
    OutputQueueSettings,
    QueuesConfig,
)
from agentkernel.core.config.stores import (
    DynamoDBStoreConfig,
    RedisStoreConfig,
    ResponseRedisConfig,
    ResponseStoreConfig,
    SessionConfig,
)

_QueuesConfig = QueuesConfig
_InputQueueConfig = InputQueueSettings
_OutputQueueConfig = OutputQueueSettings
_InMemoryQueueConfig = InMemoryQueueConfig
_NatsQueueConfig = NatsQueueConfig
_KafkaQueueConfig = KafkaQueueConfig
_ResponseStoreConfig = ResponseStoreConfig
_ResponseStoreRedisConfig = ResponseRedisConfig
_ResponseStoreValkeyConfig = ResponseRedisConfig
_ResponseStoreDynamoDBConfig = DynamoDBStoreConfig
_RedisConfig = RedisStoreConfig
_ValkeyConfig = RedisStoreConfig
_DynamoDBConfig = DynamoDBStoreConfig
_SessionStoreConfig = SessionConfig
_ExecutionConfig = ExecutionConfig
_APIConfig = ApiConfig
_LoggingConfig = LoggingConfig
_LogLevelConfig = LoggerConfig
