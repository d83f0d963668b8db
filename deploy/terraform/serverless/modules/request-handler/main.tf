# Request Handler Lambda (Lambda.handler): API Gateway -> INPUT queue; rest_sync waits on the
# response table, rest_async answers 202 and GET reads the table. It also writes there: the
# ticket of each accepted turn and the deployment secret (PutItem), and the per-identity quota
# counts (GetItem, UpdateItem on one item per identity). The sessions API erases a session's
# replies, tickets and chunks (DeleteItem) and, with a session table, reads, lists (its owner
# index) and erases sessions, and keeps the turn signals there (UpdateItem: open each turn, ask
# turns to stop; BatchWriteItem: erase a session's open turns). tests/deploy checks the lists.

locals {
  environment = merge({
    AK_EXECUTION__MODE                                 = var.execution_mode
    AK_EXECUTION__QUEUES__TYPE                         = "sqs"
    AK_EXECUTION__QUEUES__INPUT__URL                   = var.input_queue_url
    AK_EXECUTION__QUEUES__OUTPUT__URL                  = var.output_queue_url
    AK_EXECUTION__RESPONSE_STORE__TYPE                 = "dynamodb"
    AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME = var.response_table_name
    }, var.session_table_name == null ? {} : {
    AK_SESSION__TYPE                 = "dynamodb"
    AK_SESSION__DYNAMODB__TABLE_NAME = var.session_table_name
  }, var.extra_environment)

  sessions = var.session_table_arn == null ? [] : [{
    sid = "Sessions"
    actions = [
      "dynamodb:GetItem",
      "dynamodb:Query",
      "dynamodb:DeleteItem",
      "dynamodb:UpdateItem",
      "dynamodb:BatchWriteItem",
    ]
    resources = [var.session_table_arn, "${var.session_table_arn}/index/by_owner"]
  }]

  send = var.enable_sqs_send ? [{
    sid       = "SendToInput"
    actions   = ["sqs:SendMessage"]
    resources = [var.input_queue_arn]
  }] : []
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
  policy_statements = concat(local.send, [{
    sid       = "ResponseTable"
    actions   = ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"]
    resources = [var.response_table_arn]
  }], local.sessions)
}
