
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
  description = "Entry point: an entry file whose handler is Lambda.handler."
  type        = string
  default     = "request_handler.handler"
}

variable "execution_mode" {
  description = "Default reply mode (execution.mode)."
  type        = string
  default     = "rest_sync"
}

variable "enable_sqs_send" {
  description = "Grant sqs:SendMessage on the INPUT queue (false if you grant it elsewhere)."
  type        = bool
  default     = true
}

variable "input_queue_url" {
  description = "INPUT queue URL."
  type        = string
}

variable "input_queue_arn" {
  description = "INPUT queue ARN."
  type        = string
}

variable "output_queue_url" {
  description = "OUTPUT queue URL (part of the transport configuration)."
  type        = string
}

variable "response_table_name" {
  description = "Response table name."
  type        = string
}

variable "response_table_arn" {
  description = "Response table ARN."
  type        = string
}

variable "session_table_name" {
  description = "DynamoDB session table the sessions API reads; null answers those routes 501."
  type        = string
  default     = null
}

variable "session_table_arn" {
  description = "ARN of the session table (with session_table_name)."
  type        = string
  default     = null
}
