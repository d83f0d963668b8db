# WebSocket connection handler Lambda (WebsocketConnectionHandler.handler): $connect stores the
# connection (partition key connection_id, TTL expiry_time), $disconnect removes it.

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
  environment          = var.extra_environment
  policy_statements = [{
    sid       = "Connections"
    actions   = ["dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:DeleteItem"]
    resources = [var.connections_table_arn]
  }]
}
