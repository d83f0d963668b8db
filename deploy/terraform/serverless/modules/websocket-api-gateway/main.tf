# WebSocket API: $connect/$disconnect go to the connection handler, chat frames ($default) to the
# Request Handler, which enqueues them with the connection as the reply address.

data "aws_region" "current" {}

locals {
  integrations = {
    connection = { invoke_arn = var.connection_handler_invoke_arn, function = var.connection_handler_function_name }
    request    = { invoke_arn = var.request_handler_invoke_arn, function = var.request_handler_function_name }
  }
  routes = {
    "$connect"    = "connection"
    "$disconnect" = "connection"
    "$default"    = "request"
  }
}

resource "aws_apigatewayv2_api" "ws" {
  name                       = var.name
  protocol_type              = "WEBSOCKET"
  route_selection_expression = "$request.body.action"
  tags                       = var.tags
}

resource "aws_apigatewayv2_integration" "lambda" {
  for_each = local.integrations

  api_id             = aws_apigatewayv2_api.ws.id
  integration_type   = "AWS_PROXY"
  integration_uri    = each.value.invoke_arn
  integration_method = "POST"
}

resource "aws_apigatewayv2_route" "route" {
  #checkov:skip=CKV_AWS_309:$connect is authorized by the connection handler (WebsocketConnectionHandler.set_auth_validator checks the token); later frames ride the accepted connection
  for_each = local.routes

  api_id    = aws_apigatewayv2_api.ws.id
  route_key = each.key
  target    = "integrations/${aws_apigatewayv2_integration.lambda[each.value].id}"
}

resource "aws_cloudwatch_log_group" "access" {
  name              = "/aws/apigateway/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

resource "aws_apigatewayv2_stage" "stage" {
  #checkov:skip=CKV2_AWS_51:Clients are browsers and apps that present no client certificate; mutual TLS would need a custom domain and a client CA of your own
  api_id      = aws_apigatewayv2_api.ws.id
  name        = var.stage_name
  auto_deploy = true

  default_route_settings {
    throttling_burst_limit = var.throttling_burst_limit
    throttling_rate_limit  = var.throttling_rate_limit
  }

  access_log_settings {
    destination_arn = aws_cloudwatch_log_group.access.arn
    format = jsonencode({
      requestId    = "$context.requestId"
      routeKey     = "$context.routeKey"
      connectionId = "$context.connectionId"
      status       = "$context.status"
      error        = "$context.integrationErrorMessage"
    })
  }
  tags = var.tags
}

resource "aws_lambda_permission" "ws" {
  for_each = local.integrations

  statement_id  = "AllowWebSocketApi"
  action        = "lambda:InvokeFunction"
  function_name = each.value.function
  principal     = "apigateway.amazonaws.com"
  source_arn    = "${aws_apigatewayv2_api.ws.execution_arn}/*/*"
}
