variable "name_prefix" {
  description = "Prefix of the queue names (<prefix>-input.fifo, <prefix>-output.fifo, ...-dlq.fifo)."
  type        = string
}

variable "input_max_receive_count" {
  description = "The application's execution.queues.input.max_receive_count; the redrive maxReceiveCount is this + 1."
  type        = number
  default     = 3

  validation {
    condition     = var.input_max_receive_count >= 1
    error_message = "input_max_receive_count must be at least 1."
  }
}

variable "output_max_receive_count" {
  description = "The application's execution.queues.output.max_receive_count; the redrive maxReceiveCount is this + 1."
  type        = number
  default     = 3

  validation {
    condition     = var.output_max_receive_count >= 1
    error_message = "output_max_receive_count must be at least 1."
  }
}

variable "input_visibility_timeout_seconds" {
  description = "INPUT visibility timeout. With a Lambda consumer: at least 6 x its timeout."
  type        = number
  default     = 120
}

variable "output_visibility_timeout_seconds" {
  description = "OUTPUT visibility timeout. With a Lambda consumer: at least 6 x its timeout."
  type        = number
  default     = 60
}

variable "message_retention_seconds" {
  description = "How long a message may wait in INPUT/OUTPUT before SQS drops it (bounds a stuck message)."
  type        = number
  default     = 345600
}

variable "dlq_retention_seconds" {
  description = "How long dead letters are kept for inspection."
  type        = number
  default     = 1209600
}

variable "kms_master_key_id" {
  description = "KMS key for queue encryption; null uses SQS-managed encryption (SSE-SQS)."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
