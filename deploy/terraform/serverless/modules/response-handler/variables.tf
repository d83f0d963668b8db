
variable "name" {
  description = "Function name."
  type        = string
}

variable "package_file" {
  description = "Deployment zip with agentkernel and the entry files (build_package.sh)."
  type        = string
}

variable "timeout_seconds" {
  description = "Function timeout."
  type        = number
  default     = 30
}

variable "memory_mb" {
  description = "Function memory."
  type        = number
  default     = 512
}

variable "reserved_concurrency" {
  description = "Reserved concurrent executions; -1 leaves the function unreserved."
  type        = number
  default     = -1
}

variable "extra_environment" {
  description = "More environment variables (AK_* settings of config.yaml), merged over the module's own."
  type        = map(string)
  default     = {}
}

variable "log_retention_days" {
  description = "CloudWatch log retention (days; lower it if you keep logs elsewhere)."
  type        = number
  default     = 365
}

variable "kms_key_arn" {
  description = "KMS key for environment variables and logs; null uses AWS-managed keys."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}

variable "handler" {
  description = "Entry point: an entry file whose handler is ResponseHandler.handle (agentkernel.aws)."
  type        = string
  default     = "response_handler.handler"
}

variable "input_queue_url" {
  description = "INPUT queue URL (part of the transport configuration)."
  type        = string
}

variable "output_queue_url" {
  description = "OUTPUT queue URL."
  type        = string
}

variable "output_queue_arn" {
  description = "OUTPUT queue ARN (event source)."
  type        = string
}

variable "batch_size" {
  description = "Records per invocation (FIFO: 1-10)."
  type        = number
  default     = 10

  validation {
    condition     = var.batch_size >= 1 && var.batch_size <= 10
    error_message = "A FIFO event source mapping takes 1-10 records per batch."
  }
}

variable "response_table_name" {
  description = "Response table name."
  type        = string
}

variable "response_table_arn" {
  description = "Response table ARN."
  type        = string
}

variable "websocket_execution_arn" {
  description = "Execution ARN of the WebSocket API whose connections get replies; null for REST only."
  type        = string
  default     = null
}

variable "connections_table_arn" {
  description = "WebSocket connections table ARN; null for REST only."
  type        = string
  default     = null
}
