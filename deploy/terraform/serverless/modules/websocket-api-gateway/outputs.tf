output "websocket_url" {
  description = "wss:// URL clients connect to."
  value       = "${aws_apigatewayv2_api.ws.api_endpoint}/${aws_apigatewayv2_stage.stage.name}"
}

output "execution_arn" {
  description = "Execution ARN (scopes execute-api:ManageConnections)."
  value       = aws_apigatewayv2_api.ws.execution_arn
}

output "management_endpoint" {
  description = "The @connections endpoint replies are posted to."
  value       = "https://${aws_apigatewayv2_api.ws.id}.execute-api.${data.aws_region.current.name}.amazonaws.com/${aws_apigatewayv2_stage.stage.name}"
}
