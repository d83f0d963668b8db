output "function_name" {
  description = "Function name."
  value       = aws_lambda_function.this.function_name
}

output "function_arn" {
  description = "Function ARN."
  value       = aws_lambda_function.this.arn
}

output "invoke_arn" {
  description = "ARN API Gateway integrations invoke."
  value       = aws_lambda_function.this.invoke_arn
}

output "role_name" {
  description = "The function's IAM role."
  value       = aws_iam_role.this.name
}
