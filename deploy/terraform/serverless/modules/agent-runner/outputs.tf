output "function_name" {
  description = "Function name."
  value       = module.function.function_name
}

output "function_arn" {
  description = "Function ARN."
  value       = module.function.function_arn
}

output "invoke_arn" {
  description = "ARN API Gateway integrations invoke."
  value       = module.function.invoke_arn
}

output "event_source_mapping_uuid" {
  description = "The INPUT event source mapping."
  value       = aws_lambda_event_source_mapping.input.uuid
}
