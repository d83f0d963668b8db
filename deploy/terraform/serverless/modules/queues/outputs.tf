output "input_queue_url" {
  description = "AK_EXECUTION__QUEUES__INPUT__URL."
  value       = aws_sqs_queue.queue["input"].url
}

output "input_queue_arn" {
  description = "ARN of the INPUT queue."
  value       = aws_sqs_queue.queue["input"].arn
}

output "output_queue_url" {
  description = "AK_EXECUTION__QUEUES__OUTPUT__URL."
  value       = aws_sqs_queue.queue["output"].url
}

output "output_queue_arn" {
  description = "ARN of the OUTPUT queue."
  value       = aws_sqs_queue.queue["output"].arn
}

output "input_dlq_arn" {
  description = "ARN of the INPUT dead-letter queue."
  value       = aws_sqs_queue.dlq["input"].arn
}

output "output_dlq_arn" {
  description = "ARN of the OUTPUT dead-letter queue."
  value       = aws_sqs_queue.dlq["output"].arn
}

output "input_max_receive_count" {
  description = "The application value to set as AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT."
  value       = var.input_max_receive_count
}

output "output_max_receive_count" {
  description = "The application value to set as AK_EXECUTION__QUEUES__OUTPUT__MAX_RECEIVE_COUNT."
  value       = var.output_max_receive_count
}
