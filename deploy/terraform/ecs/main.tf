# The containerized (ECS on Fargate) stack of the queue-mode guide:
#   IO service (REST API + OUTPUT consumers) -> INPUT -> Agent Runner service -> OUTPUT -> IO
#   -> DynamoDB response table. queue_mode = false runs one embedded service instead.
# Usage: terraform init && terraform apply -var region=... -var image=... -var vpc_id=... \
#          -var 'subnet_ids=[...]' -var 'api_ingress_cidr_blocks=[...]'

locals {
  # A stopping runner stops receiving after its current long poll (<= 20 s), then finishes the
  # turns it holds; the IO task drains replies and open HTTP responses within about 30 s.
  runner_drain_seconds = var.max_turn_seconds + 20
  io_drain_seconds     = 30

  io_environment = var.queue_mode ? {
    AK_EXECUTION__QUEUES__INPUT__URL                   = module.queues[0].input_queue_url
    AK_EXECUTION__QUEUES__OUTPUT__URL                  = module.queues[0].output_queue_url
    AK_EXECUTION__QUEUES__OUTPUT__NO_OF_CONSUMERS      = tostring(var.output_no_of_consumers)
    AK_EXECUTION__QUEUES__BATCH_SIZE                   = tostring(var.batch_size)
    AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME = module.tables[0].response_table_name
    AK_SESSION__TYPE                                   = "dynamodb" # the sessions API reads them
    AK_SESSION__DYNAMODB__TABLE_NAME                   = module.tables[0].session_table_name
    AK_API__PORT                                       = tostring(var.api_port)
    } : {
    AK_API__PORT = tostring(var.api_port)
  }

  runner_environment = var.queue_mode ? {
    AK_EXECUTION__QUEUES__INPUT__URL               = module.queues[0].input_queue_url
    AK_EXECUTION__QUEUES__OUTPUT__URL              = module.queues[0].output_queue_url
    AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT = tostring(module.queues[0].input_max_receive_count)
    AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS   = tostring(var.input_no_of_consumers)
    AK_EXECUTION__QUEUES__BATCH_SIZE               = tostring(var.batch_size)
    AK_SESSION__TYPE                               = "dynamodb"
    AK_SESSION__DYNAMODB__TABLE_NAME               = module.tables[0].session_table_name
    AK_EXECUTION__RUNNER__HEALTH_PORT              = tostring(var.runner_health_port)
    AK_EXECUTION__RUNNER__HEALTH_HOST              = "0.0.0.0"
  } : {}
}

module "queues" {
  source = "../serverless/modules/queues"
  count  = var.queue_mode ? 1 : 0

  name_prefix                      = var.name
  input_max_receive_count          = var.max_receive_count
  input_visibility_timeout_seconds = var.input_visibility_timeout_seconds
  tags                             = var.tags
}

module "tables" {
  source = "../serverless/modules/tables"
  count  = var.queue_mode ? 1 : 0

  name_prefix          = var.name
  create_session_table = true
  tags                 = var.tags
}

resource "aws_ecs_cluster" "this" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
  tags = var.tags
}

resource "aws_cloudwatch_log_group" "service" {
  for_each = toset(["io", "runner"])

  name              = "/ecs/${var.name}/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

resource "aws_security_group" "tasks" {
  name        = "${var.name}-tasks"
  description = "agentkernel tasks: the REST API port in, HTTPS to AWS APIs out"
  vpc_id      = var.vpc_id

  ingress {
    description = "REST API"
    from_port   = var.api_port
    to_port     = var.api_port
    protocol    = "tcp"
    cidr_blocks = var.api_ingress_cidr_blocks
  }

  egress {
    description = "HTTPS to SQS, DynamoDB, CloudWatch, ECR and your model provider"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
  tags = var.tags
}

locals {
  container_defaults = {
    essential              = true
    readonlyRootFilesystem = true
    stopTimeout            = var.stop_timeout_seconds
    mountPoints            = [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }]
  }
}

resource "aws_ecs_task_definition" "io" {
  family                   = "${var.name}-io"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.io_cpu
  memory                   = var.io_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.io.arn

  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([merge(local.container_defaults, {
    name         = "io"
    image        = var.image
    command      = var.queue_mode ? var.io_command : var.embedded_command
    environment  = [for k, v in local.io_environment : { name = k, value = v }]
    portMappings = [{ containerPort = var.api_port, protocol = "tcp" }]
    healthCheck = {
      command     = ["CMD", "python", "/app/healthcheck.py"]
      interval    = 30
      timeout     = 5
      retries     = 3
      startPeriod = 20
    }
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.service["io"].name
        awslogs-region        = var.region
        awslogs-stream-prefix = "io"
      }
    }
  })])

  lifecycle {
    precondition {
      condition     = var.stop_timeout_seconds > local.io_drain_seconds
      error_message = "stop_timeout_seconds must exceed the IO drain (about 30 s)."
    }
  }
  tags = var.tags
}

resource "aws_ecs_task_definition" "runner" {
  count = var.queue_mode ? 1 : 0

  family                   = "${var.name}-runner"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.runner_cpu
  memory                   = var.runner_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.runner[0].arn

  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([merge(local.container_defaults, {
    name        = "runner"
    image       = var.image
    command     = var.runner_command
    environment = [for k, v in local.runner_environment : { name = k, value = v }]
    # GET /health on the runner's health port (healthcheck.py reads it from the environment)
    healthCheck = {
      command     = ["CMD", "python", "/app/healthcheck.py"]
      interval    = 30
      timeout     = 5
      retries     = 3
      startPeriod = 20
    }
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.service["runner"].name
        awslogs-region        = var.region
        awslogs-stream-prefix = "runner"
      }
    }
  })])

  lifecycle {
    precondition {
      condition     = var.stop_timeout_seconds > local.runner_drain_seconds
      error_message = "stop_timeout_seconds must exceed max_turn_seconds + 20 (one long poll), or SIGKILL cuts turns short."
    }
  }
  tags = var.tags
}

resource "aws_ecs_service" "io" {
  name                               = "${var.name}-io"
  cluster                            = aws_ecs_cluster.this.id
  task_definition                    = aws_ecs_task_definition.io.arn
  desired_count                      = var.queue_mode ? var.io_desired_count : 1
  launch_type                        = "FARGATE"
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = false
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  dynamic "load_balancer" {
    for_each = var.target_group_arn == null ? [] : [var.target_group_arn]
    content {
      target_group_arn = load_balancer.value
      container_name   = "io"
      container_port   = var.api_port
    }
  }
  tags = var.tags
}

resource "aws_ecs_service" "runner" {
  count = var.queue_mode ? 1 : 0

  name                               = "${var.name}-runner"
  cluster                            = aws_ecs_cluster.this.id
  task_definition                    = aws_ecs_task_definition.runner[0].arn
  desired_count                      = var.runner_desired_count
  launch_type                        = "FARGATE"
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = false
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  lifecycle {
    # Target tracking owns the task count once the service exists.
    ignore_changes = [desired_count]
  }
  tags = var.tags
}
