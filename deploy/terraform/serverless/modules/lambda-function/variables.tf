variable "name" {
  description = "Function, role and log group name."
  type        = string
}

variable "package_file" {
  description = "Path of the deployment zip (deploy/terraform/serverless/build_package.sh)."
  type        = string
}

variable "handler" {
  description = "Entry point, <entry file>.<attribute>."
  type        = string
}

variable "runtime" {
  description = "Lambda Python runtime."
  type        = string
  default     = "python3.12"
}

variable "architecture" {
  description = "x86_64 or arm64; must match the platform the package was built for."
  type        = string
  default     = "x86_64"
}

variable "timeout_seconds" {
  description = "Function timeout."
  type        = number
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

variable "environment" {
  description = "Environment variables (AK_* configuration)."
  type        = map(string)
}

variable "policy_statements" {
  description = "IAM statements the function needs besides writing its logs."
  type = list(object({
    sid       = string
    actions   = list(string)
    resources = list(string)
  }))
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
