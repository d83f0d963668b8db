# Response Handler Lambda (ResponseHandler.handle) fed by the OUTPUT queue's event source mapping:
# REST replies go to the response table, WebSocket replies to the connection (PostToConnection).
# Each stored reply is counted against its identity's quota (UpdateItem on the identity's item).

locals {
  environment = merge({
    AK_EXECUTION__QUEUES__TYPE                         = "sqs"
    AK_EXECUTION__QUEUES__INPUT__URL                   = var.input_queue_url
    AK_EXECUTION__QUEUES__OUTPUT__URL                  = var.output_queue_url
    AK_EXECUTION__QUEUES__BATCH_SIZE                   = tostring(var.batch_size)
    AK_EXECUTION__RESPONSE_STORE__TYPE                 = "dynamodb"
    AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME = var.response_table_name
  }, var.extra_environment)

  websocket = var.websocket_execution_arn == null ? [] : [{
    sid       = "PushToConnections"
    actions   = ["execute-api:ManageConnections"]
    resources = ["${var.websocket_execution_arn}/*/POST/@connections/*"]
  }]
  connections = var.connections_table_arn == null ? [] : [{
    sid       = "ForgetGoneConnections"
    actions   = ["dynamodb:GetItem", "dynamodb:DeleteItem"]
    resources = [var.connections_table_arn]
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
  handler              = var.handler
  environment          = local.environment
  policy_statements = concat([
    {
      sid = "ConsumeOutput"
      actions = [
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
      ]
      resources = [var.output_queue_arn]
    },
    {
      sid       = "WriteReplies"
      actions   = ["dynamodb:PutItem", "dynamodb:UpdateItem"]
      resources = [var.response_table_arn]
    },
  ], local.websocket, local.connections)
}

resource "aws_lambda_event_source_mapping" "output" {
  event_source_arn        = var.output_queue_arn
  function_name           = module.function.function_arn
  batch_size              = var.batch_size
  function_response_types = ["ReportBatchItemFailures"]
}
