# Backlog-per-task scaling of the Agent Runner service (the queue-mode guide's policy):
# a Lambda (agentkernel.aws.scaling.lambda_handler) runs every minute, publishes
# Custom/ECS/BacklogPerTask = INPUT depth / max(running tasks, 1), and target tracking keeps it
# at scaling_config.backlog_target.

locals {
  scaling = var.queue_mode && var.scaling_config != null
}

resource "aws_appautoscaling_target" "runner" {
  count = local.scaling ? 1 : 0

  service_namespace  = "ecs"
  resource_id        = "service/${aws_ecs_cluster.this.name}/${aws_ecs_service.runner[0].name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = var.scaling_config.min_tasks
  max_capacity       = var.scaling_config.max_tasks
}

resource "aws_appautoscaling_policy" "backlog" {
  count = local.scaling ? 1 : 0

  name               = "${var.name}-runner-backlog-per-task"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.runner[0].service_namespace
  resource_id        = aws_appautoscaling_target.runner[0].resource_id
  scalable_dimension = aws_appautoscaling_target.runner[0].scalable_dimension

  target_tracking_scaling_policy_configuration {
    target_value       = var.scaling_config.backlog_target
    scale_in_cooldown  = var.scaling_config.scale_in_cooldown
    scale_out_cooldown = var.scaling_config.scale_out_cooldown

    customized_metric_specification {
      namespace   = "Custom/ECS"
      metric_name = "BacklogPerTask"
      statistic   = "Average"
      unit        = "Count"

      dimensions {
        name  = "ClusterName"
        value = aws_ecs_cluster.this.name
      }
      dimensions {
        name  = "ServiceName"
        value = aws_ecs_service.runner[0].name
      }
    }
  }
}

data "aws_iam_policy_document" "lambda_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "scaling" {
  count = local.scaling ? 1 : 0

  name               = "${var.name}-backlog-publisher"
  assume_role_policy = data.aws_iam_policy_document.lambda_assume.json
  tags               = var.tags
}

resource "aws_cloudwatch_log_group" "scaling" {
  count = local.scaling ? 1 : 0

  name              = "/aws/lambda/${var.name}-backlog-publisher"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

data "aws_iam_policy_document" "scaling" {
  count = local.scaling ? 1 : 0

  statement {
    sid       = "QueueDepth"
    actions   = ["sqs:GetQueueAttributes"]
    resources = [module.queues[0].input_queue_arn]
  }

  statement {
    sid       = "RunningTasks"
    actions   = ["ecs:DescribeServices"]
    resources = [aws_ecs_service.runner[0].id]
  }

  statement {
    # PutMetricData has no resource-level permissions; the condition pins the namespace.
    sid       = "PublishMetric"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = ["Custom/ECS"]
    }
  }

  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.scaling[0].arn}:*"]
  }
}

resource "aws_iam_role_policy" "scaling" {
  count = local.scaling ? 1 : 0

  name   = "${var.name}-backlog-publisher"
  role   = aws_iam_role.scaling[0].id
  policy = data.aws_iam_policy_document.scaling[0].json
}

resource "aws_lambda_function" "scaling" {
  #checkov:skip=CKV_AWS_116:A missed run of the minute schedule only delays one metric point; the next run publishes a fresh one
  #checkov:skip=CKV_AWS_117:The function calls only AWS APIs; attaching it to a VPC adds NAT cost and cold-start time without protecting anything here
  #checkov:skip=CKV_AWS_272:Code signing needs a signing profile of your own; add code_signing_config_arn when you have one
  count = local.scaling ? 1 : 0

  function_name                  = "${var.name}-backlog-publisher"
  role                           = aws_iam_role.scaling[0].arn
  filename                       = var.scaling_package_file
  source_code_hash               = filebase64sha256(var.scaling_package_file)
  handler                        = "agentkernel.aws.scaling.lambda_handler"
  runtime                        = "python3.12"
  timeout                        = 30
  memory_size                    = 256
  reserved_concurrent_executions = 1
  kms_key_arn                    = var.kms_key_arn

  environment {
    variables = {
      AK_EXECUTION__QUEUES__INPUT__URL = module.queues[0].input_queue_url
      ECS_CLUSTER                      = aws_ecs_cluster.this.name
      ECS_SERVICE                      = aws_ecs_service.runner[0].name
    }
  }

  tracing_config {
    mode = "PassThrough"
  }

  tags       = var.tags
  depends_on = [aws_cloudwatch_log_group.scaling, aws_iam_role_policy.scaling]
}

resource "aws_cloudwatch_event_rule" "scaling" {
  count = local.scaling ? 1 : 0

  name                = "${var.name}-backlog-publisher"
  description         = "Publish Custom/ECS/BacklogPerTask of the Agent Runner service"
  schedule_expression = "rate(1 minute)"
  tags                = var.tags
}

resource "aws_cloudwatch_event_target" "scaling" {
  count = local.scaling ? 1 : 0

  rule = aws_cloudwatch_event_rule.scaling[0].name
  arn  = aws_lambda_function.scaling[0].arn
}

resource "aws_lambda_permission" "scaling" {
  count = local.scaling ? 1 : 0

  statement_id  = "AllowEventBridge"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.scaling[0].function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.scaling[0].arn
}
