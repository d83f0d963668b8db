variable "region" {
  description = "AWS region."
  type        = string
}

variable "name" {
  description = "Prefix of every resource name."
  type        = string
  default     = "agentkernel"
}

variable "image" {
  description = "Container image built from deploy/docker/Dockerfile (with your app_agent_runner.py)."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the services."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets of the tasks (they need a route to SQS, DynamoDB and ECR: NAT or VPC endpoints)."
  type        = list(string)
}

variable "api_ingress_cidr_blocks" {
  description = "Who may reach the IO service's port (your load balancer's subnets)."
  type        = list(string)
}

variable "target_group_arn" {
  description = "Target group (IP targets, health check on /health) of your load balancer for the IO service; null for none."
  type        = string
  default     = null
}

variable "queue_mode" {
  description = "true: IO service + Agent Runner service on SQS queues and a DynamoDB response table. false: one embedded service (API and runner in one task, no queues), for trying out."
  type        = bool
  default     = true
}

variable "api_port" {
  description = "Port of the REST API (api.port)."
  type        = number
  default     = 8000
}

variable "runner_health_port" {
  description = "Port of the Agent Runner's /health, /ready and /metrics (execution.runner.health_port); the task's health check probes it."
  type        = number
  default     = 8001
}

variable "io_command" {
  description = "IO container command: the guide's entry file (ECSIOHandler)."
  type        = list(string)
  default     = ["python", "/app/app_rest_service.py"]
}

variable "runner_command" {
  description = "Agent Runner container command: the guide's entry file (ECSAgentRunner with your agents)."
  type        = list(string)
  default     = ["python", "/app/app_agent_runner.py"]
}

variable "embedded_command" {
  description = "Command of the single service when queue_mode = false."
  type        = list(string)
  default     = ["agentkernel", "serve", "/app/app_agent_runner.py"]
}

variable "io_desired_count" {
  description = "IO tasks."
  type        = number
  default     = 2
}

variable "io_cpu" {
  description = "IO task CPU units."
  type        = number
  default     = 512
}

variable "io_memory" {
  description = "IO task memory (MiB)."
  type        = number
  default     = 1024
}

variable "runner_cpu" {
  description = "Agent Runner task CPU units."
  type        = number
  default     = 1024
}

variable "runner_memory" {
  description = "Agent Runner task memory (MiB)."
  type        = number
  default     = 2048
}

variable "max_receive_count" {
  description = "execution.queues.input.max_receive_count; the INPUT redrive maxReceiveCount is this + 1."
  type        = number
  default     = 3
}

variable "batch_size" {
  description = "Messages per receive on both queues (1-10)."
  type        = number
  default     = 10
}

variable "input_no_of_consumers" {
  description = "INPUT consumer threads per Agent Runner task."
  type        = number
  default     = 5
}

variable "output_no_of_consumers" {
  description = "OUTPUT consumer threads per IO task."
  type        = number
  default     = 2
}

variable "max_turn_seconds" {
  description = "Your longest turn. A stopping runner finishes its turns first, so the stop timeout must exceed this plus one SQS long poll (20 s)."
  type        = number
  default     = 90
}

variable "stop_timeout_seconds" {
  description = "Seconds ECS waits after SIGTERM before SIGKILL (Fargate allows at most 120)."
  type        = number
  default     = 120

  validation {
    condition     = var.stop_timeout_seconds >= 2 && var.stop_timeout_seconds <= 120
    error_message = "Fargate accepts a stop timeout of 2-120 seconds."
  }
}

variable "input_visibility_timeout_seconds" {
  description = "INPUT visibility timeout; runners extend it while a turn runs."
  type        = number
  default     = 120
}

variable "scaling_config" {
  description = "Backlog-per-task target tracking of the Agent Runner service; null for a fixed runner_desired_count."
  type = object({
    min_tasks          = number
    max_tasks          = number
    backlog_target     = number
    scale_in_cooldown  = optional(number, 120)
    scale_out_cooldown = optional(number, 60)
  })
  default = {
    min_tasks      = 1
    max_tasks      = 10
    backlog_target = 5
  }
}

variable "runner_desired_count" {
  description = "Agent Runner tasks when scaling_config is null (and the start count otherwise)."
  type        = number
  default     = 1
}

variable "scaling_package_file" {
  description = "Zip with agentkernel[aws] for the scaling Lambda (deploy/terraform/serverless/build_package.sh builds one)."
  type        = string
  default     = "../serverless/build/agentkernel-lambda.zip"
}

variable "log_retention_days" {
  description = "CloudWatch log retention (days; lower it if you keep logs elsewhere)."
  type        = number
  default     = 365
}

variable "kms_key_arn" {
  description = "KMS key for logs and Lambda environment; null uses AWS-managed keys."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
