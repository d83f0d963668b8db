variable "name_prefix" {
  description = "Prefix of the table names."
  type        = string
}

variable "create_session_table" {
  description = "Create the session table (partition key session_id) for session.type: dynamodb."
  type        = bool
  default     = true
}

variable "create_connections_table" {
  description = "Create the WebSocket connections table (partition key connection_id)."
  type        = bool
  default     = false
}

variable "point_in_time_recovery" {
  description = "Enable point-in-time recovery on every table."
  type        = bool
  default     = true
}

variable "deletion_protection" {
  description = "Refuse to delete the tables (turn off before terraform destroy)."
  type        = bool
  default     = false
}

variable "kms_key_arn" {
  description = "Customer-managed KMS key for the tables; null uses the AWS managed key (aws/dynamodb)."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
