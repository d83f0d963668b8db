
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
  description = "Entry point: an entry file whose handler is ServerlessAgentRunner.handle."
  type        = string
  default     = "agent_runner.handler"
}

variable "stream_handler" {
  description = "Entry point used when stream = true: ServerlessStreamAgentRunner.handle."
  type        = string
  default     = "stream_agent_runner.handler"
}

variable "stream" {
  description = "Send one OUTPUT message per token chunk (WebSocket streaming)."
  type        = bool
  default     = false
}

variable "input_queue_url" {
  description = "INPUT queue URL."
  type        = string
}

variable "input_queue_arn" {
  description = "INPUT queue ARN (event source)."
  type        = string
}

variable "output_queue_url" {
  description = "OUTPUT queue URL."
  type        = string
}

variable "output_queue_arn" {
  description = "OUTPUT queue ARN."
  type        = string
}

variable "max_receive_count" {
  description = "execution.queues.input.max_receive_count; the queues module sets the redrive count to this + 1."
  type        = number
  default     = 3
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

variable "maximum_concurrency" {
  description = "Most concurrent invocations the event source mapping starts (2-1000); null for no cap."
  type        = number
  default     = null
}

variable "session_table_name" {
  description = "DynamoDB session table; null keeps sessions in memory (not shared across invocations)."
  type        = string
  default     = null
}

variable "session_table_arn" {
  description = "ARN of the session table (with session_table_name)."
  type        = string
  default     = null
}
