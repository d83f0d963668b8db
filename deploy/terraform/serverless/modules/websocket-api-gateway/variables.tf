variable "name" {
  description = "API name."
  type        = string
}

variable "stage_name" {
  description = "Stage name (part of the wss:// URL and of the management endpoint)."
  type        = string
  default     = "live"
}

variable "connection_handler_function_name" {
  description = "WebSocket connection handler function name."
  type        = string
}

variable "connection_handler_invoke_arn" {
  description = "WebSocket connection handler invoke ARN."
  type        = string
}

variable "request_handler_function_name" {
  description = "Request Handler function name."
  type        = string
}

variable "request_handler_invoke_arn" {
  description = "Request Handler invoke ARN."
  type        = string
}

variable "throttling_burst_limit" {
  description = "Stage burst limit (messages)."
  type        = number
  default     = 500
}

variable "throttling_rate_limit" {
  description = "Stage steady rate limit (messages per second)."
  type        = number
  default     = 100
}

variable "log_retention_days" {
  description = "Access log retention (days; lower it if you keep logs elsewhere)."
  type        = number
  default     = 365
}

variable "kms_key_arn" {
  description = "KMS key for the access logs; null uses the service key."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
