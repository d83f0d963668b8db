
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
  description = "Entry point: an entry file whose handler is WebsocketConnectionHandler.handler."
  type        = string
  default     = "ws_connection_handler.handler"
}

variable "connections_table_arn" {
  description = "WebSocket connections table ARN."
  type        = string
}
