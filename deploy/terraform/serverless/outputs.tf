output "api_endpoint" {
  description = "POST <api_endpoint>/api/v1/chat."
  value       = module.api.api_endpoint
}

output "websocket_url" {
  description = "wss:// URL for WebSocket clients (null without websocket)."
  value       = var.websocket ? module.websocket_api[0].websocket_url : null
}

output "websocket_management_endpoint" {
  description = "The @connections endpoint the Response Handler posts to (null without websocket)."
  value       = var.websocket ? module.websocket_api[0].management_endpoint : null
}

output "input_queue_url" {
  description = "INPUT queue."
  value       = module.queues.input_queue_url
}

output "output_queue_url" {
  description = "OUTPUT queue."
  value       = module.queues.output_queue_url
}

output "input_dlq_arn" {
  description = "Where INPUT messages go after max_receive_count + 1 deliveries."
  value       = module.queues.input_dlq_arn
}

output "response_table_name" {
  description = "Response table."
  value       = module.tables.response_table_name
}
