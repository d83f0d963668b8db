variable "region" {
  description = "AWS region."
  type        = string
}

variable "name" {
  description = "Prefix of every resource name."
  type        = string
  default     = "agentkernel"
}

variable "package_file" {
  description = "Lambda deployment zip built by build_package.sh."
  type        = string
  default     = "build/agentkernel-lambda.zip"
}

variable "execution_mode" {
  description = "Default reply mode of POST /api/v1/chat (execution.mode)."
  type        = string
  default     = "rest_sync"
}

variable "max_receive_count" {
  description = "execution.queues.input.max_receive_count: deliveries before the error reply. The INPUT redrive maxReceiveCount is this + 1."
  type        = number
  default     = 3
}

variable "batch_size" {
  description = "SQS records per Agent Runner / Response Handler invocation (1-10)."
  type        = number
  default     = 10
}

variable "agent_runner_timeout_seconds" {
  description = "Agent Runner timeout: your longest turn times the batch's turns that share a session, plus margin. The INPUT visibility timeout is 6 x this."
  type        = number
  default     = 120
}

variable "response_handler_timeout_seconds" {
  description = "Response Handler timeout. The OUTPUT visibility timeout is 6 x this."
  type        = number
  default     = 30
}

variable "request_handler_timeout_seconds" {
  description = "Request Handler timeout; API Gateway answers 504 after 29 s anyway."
  type        = number
  default     = 30
}

variable "stream" {
  description = "Stream replies token by token to WebSocket clients (ServerlessStreamAgentRunner)."
  type        = bool
  default     = false
}

variable "websocket" {
  description = "Create the WebSocket API, its connection handler and the connections table."
  type        = bool
  default     = true
}

variable "websocket_environment" {
  description = "More AK_* settings for the WebSocket connection and response handlers (the connections table is set already)."
  type        = map(string)
  default     = {}
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
