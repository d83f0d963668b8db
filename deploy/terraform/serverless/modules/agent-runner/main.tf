# Agent Runner Lambda (ServerlessAgentRunner.handle, or ServerlessStreamAgentRunner.handle with
# stream = true) fed by the INPUT queue's event source mapping. ReportBatchItemFailures makes SQS
# retry only the records the handler lists. Keep the INPUT visibility timeout >= 6 x timeout_seconds.

locals {
  environment = merge({
    AK_EXECUTION__QUEUES__TYPE                     = "sqs"
    AK_EXECUTION__QUEUES__INPUT__URL               = var.input_queue_url
    AK_EXECUTION__QUEUES__OUTPUT__URL              = var.output_queue_url
    AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT = tostring(var.max_receive_count)
    AK_EXECUTION__QUEUES__BATCH_SIZE               = tostring(var.batch_size)
    }, var.session_table_name == null ? {} : {
    AK_SESSION__TYPE                 = "dynamodb"
    AK_SESSION__DYNAMODB__TABLE_NAME = var.session_table_name
  }, var.extra_environment)

  # Sessions, and the turn signals kept beside them: start and close each turn (UpdateItem,
  # DeleteItem), poll the stops asked for the turns it runs (BatchGetItem).
  sessions = var.session_table_arn == null ? [] : [{
    sid = "Sessions"
    actions = [
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
      "dynamodb:DeleteItem",
      "dynamodb:BatchGetItem",
    ]
    resources = [var.session_table_arn]
  }]
}

module "function" {
  source = "../lambda-function"

  name                 = var.name
  package_file         = var.package_file
  timeout_seconds      = var.timeout_seconds
  memory_mb            = var.memory_mb
  reserved_concurrency = var.reserved_concurrency
  log_retention_days   = var.log_retention_days
  kms_key_arn          = var.kms_key_arn
  tags                 = var.tags
  handler              = var.stream ? var.stream_handler : var.handler
  environment          = local.environment
  policy_statements = concat([
    {
      sid = "ConsumeInput"
      actions = [
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
      ]
      resources = [var.input_queue_arn]
    },
    {
      sid       = "SendToOutput"
      actions   = ["sqs:SendMessage"]
      resources = [var.output_queue_arn]
    },
  ], local.sessions)
}

resource "aws_lambda_event_source_mapping" "input" {
  event_source_arn        = var.input_queue_arn
  function_name           = module.function.function_arn
  batch_size              = var.batch_size
  function_response_types = ["ReportBatchItemFailures"]

  dynamic "scaling_config" {
    for_each = var.maximum_concurrency == null ? [] : [var.maximum_concurrency]
    content {
      maximum_concurrency = scaling_config.value
    }
  }
}
