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

