output "cluster_name" {
  description = "ECS cluster."
  value       = aws_ecs_cluster.this.name
}

output "io_service_name" {
  description = "IO service (the embedded service when queue_mode = false)."
  value       = aws_ecs_service.io.name
}

output "runner_service_name" {
  description = "Agent Runner service (null when queue_mode = false)."
  value       = var.queue_mode ? aws_ecs_service.runner[0].name : null
}

output "input_queue_url" {
  description = "INPUT queue (null when queue_mode = false)."
  value       = var.queue_mode ? module.queues[0].input_queue_url : null
}

output "output_queue_url" {
  description = "OUTPUT queue (null when queue_mode = false)."
  value       = var.queue_mode ? module.queues[0].output_queue_url : null
}

output "response_table_name" {
  description = "DynamoDB response table (null when queue_mode = false)."
  value       = var.queue_mode ? module.tables[0].response_table_name : null
}
