output "api_endpoint" {
  description = "Base URL: POST <api_endpoint>/api/v1/chat."
  value       = aws_apigatewayv2_api.http.api_endpoint
}

output "api_id" {
  description = "API id."
  value       = aws_apigatewayv2_api.http.id
}
