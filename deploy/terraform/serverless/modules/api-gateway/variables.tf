variable "name" {
  description = "API name."
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
  description = "Stage burst limit (requests)."
  type        = number
  default     = 500
}

variable "throttling_rate_limit" {
  description = "Stage steady rate limit (requests per second)."
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
