output "response_table_name" {
  description = "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME."
  value       = aws_dynamodb_table.table["response"].name
}

output "response_table_arn" {
  description = "ARN of the response table."
  value       = aws_dynamodb_table.table["response"].arn
}

output "session_table_name" {
  description = "AK_SESSION__DYNAMODB__TABLE_NAME (null when not created)."
  value       = var.create_session_table ? aws_dynamodb_table.table["session"].name : null
}

output "session_table_arn" {
  description = "ARN of the session table (null when not created)."
  value       = var.create_session_table ? aws_dynamodb_table.table["session"].arn : null
}

output "connections_table_name" {
  description = "Name of the WebSocket connections table (null when not created)."
  value       = var.create_connections_table ? aws_dynamodb_table.table["connections"].name : null
}

output "connections_table_arn" {
  description = "ARN of the WebSocket connections table (null when not created)."
  value       = var.create_connections_table ? aws_dynamodb_table.table["connections"].arn : null
}
