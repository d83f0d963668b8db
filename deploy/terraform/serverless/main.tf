# The serverless stack of the queue-mode guide, wired end to end:
#   HTTP API / WebSocket API -> Request Handler -> INPUT -> Agent Runner -> OUTPUT
#   -> Response Handler -> response table (REST) or PostToConnection (WebSocket).
# Usage: ./build_package.sh && terraform init && terraform apply -var region=eu-west-1

locals {
  # AWS's rule for an SQS event source: visibility timeout >= 6 x the function timeout.
  input_visibility_timeout_seconds  = 6 * var.agent_runner_timeout_seconds
  output_visibility_timeout_seconds = 6 * var.response_handler_timeout_seconds
}

module "queues" {
  source = "./modules/queues"

  name_prefix                       = var.name
  input_max_receive_count           = var.max_receive_count
  input_visibility_timeout_seconds  = local.input_visibility_timeout_seconds
  output_visibility_timeout_seconds = local.output_visibility_timeout_seconds
  tags                              = var.tags
}

module "tables" {
  source = "./modules/tables"

  name_prefix              = var.name
  create_session_table     = true
  create_connections_table = var.websocket
  tags                     = var.tags
}

module "request_handler" {
  source = "./modules/request-handler"

  name                = "${var.name}-request-handler"
  package_file        = var.package_file
  timeout_seconds     = var.request_handler_timeout_seconds
  execution_mode      = var.execution_mode
  input_queue_url     = module.queues.input_queue_url
  input_queue_arn     = module.queues.input_queue_arn
  output_queue_url    = module.queues.output_queue_url
  response_table_name = module.tables.response_table_name
  response_table_arn  = module.tables.response_table_arn
  session_table_name  = module.tables.session_table_name
  session_table_arn   = module.tables.session_table_arn
  tags                = var.tags
}

module "agent_runner" {
  source = "./modules/agent-runner"

  name               = "${var.name}-agent-runner"
  package_file       = var.package_file
  timeout_seconds    = var.agent_runner_timeout_seconds
  stream             = var.stream
  input_queue_url    = module.queues.input_queue_url
  input_queue_arn    = module.queues.input_queue_arn
  output_queue_url   = module.queues.output_queue_url
  output_queue_arn   = module.queues.output_queue_arn
  max_receive_count  = module.queues.input_max_receive_count
  batch_size         = var.batch_size
  session_table_name = module.tables.session_table_name
  session_table_arn  = module.tables.session_table_arn
  tags               = var.tags
}

locals {
  # Where the connection and response handlers find the open WebSocket connections.
  websocket_environment = merge(
    var.websocket ? { AK_API__WEBSOCKET__CONNECTIONS_TABLE = module.tables.connections_table_name } : {},
    var.websocket_environment,
  )
}

module "response_handler" {
  source = "./modules/response-handler"

  name                    = "${var.name}-response-handler"
  package_file            = var.package_file
  timeout_seconds         = var.response_handler_timeout_seconds
  input_queue_url         = module.queues.input_queue_url
  output_queue_url        = module.queues.output_queue_url
  output_queue_arn        = module.queues.output_queue_arn
  batch_size              = var.batch_size
  response_table_name     = module.tables.response_table_name
  response_table_arn      = module.tables.response_table_arn
  websocket_execution_arn = var.websocket ? module.websocket_api[0].execution_arn : null
  connections_table_arn   = module.tables.connections_table_arn
  extra_environment       = var.websocket ? local.websocket_environment : {}
  tags                    = var.tags
}

module "api" {
  source = "./modules/api-gateway"

  name                          = "${var.name}-http"
  request_handler_function_name = module.request_handler.function_name
  request_handler_invoke_arn    = module.request_handler.invoke_arn
  tags                          = var.tags
}

module "ws_connection_handler" {
  source = "./modules/ws-connection-handler"
  count  = var.websocket ? 1 : 0

  name                  = "${var.name}-ws-connection-handler"
  package_file          = var.package_file
  connections_table_arn = module.tables.connections_table_arn
  extra_environment     = local.websocket_environment
  tags                  = var.tags
}

module "websocket_api" {
  source = "./modules/websocket-api-gateway"
  count  = var.websocket ? 1 : 0

  name                             = "${var.name}-ws"
  connection_handler_function_name = module.ws_connection_handler[0].function_name
  connection_handler_invoke_arn    = module.ws_connection_handler[0].invoke_arn
  request_handler_function_name    = module.request_handler.function_name
  request_handler_invoke_arn       = module.request_handler.invoke_arn
  tags                             = var.tags
}
