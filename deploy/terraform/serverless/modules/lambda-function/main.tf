# One Lambda function with its own role, log group and the policy statements its caller passes.
# Shared by the handler modules; not meant to be used on its own.

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "this" {
  name               = var.name
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

resource "aws_cloudwatch_log_group" "this" {
  name              = "/aws/lambda/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

data "aws_iam_policy_document" "this" {
  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.this.arn}:*"]
  }

  dynamic "statement" {
    for_each = var.policy_statements
    content {
      sid       = statement.value.sid
      actions   = statement.value.actions
      resources = statement.value.resources
    }
  }
}

resource "aws_iam_role_policy" "this" {
  name   = var.name
  role   = aws_iam_role.this.id
  policy = data.aws_iam_policy_document.this.json
}

resource "aws_lambda_function" "this" {
  #checkov:skip=CKV_AWS_116:Invoked synchronously (API Gateway) or by an SQS event source mapping whose queue has its own redrive DLQ; an async-invocation DLQ would never receive anything
  #checkov:skip=CKV_AWS_117:The function calls only AWS APIs and your model provider; attaching it to a VPC adds NAT cost and cold-start time without protecting anything here
  #checkov:skip=CKV_AWS_272:Code signing needs a signing profile of your own; add code_signing_config_arn when you have one
  function_name                  = var.name
  role                           = aws_iam_role.this.arn
  filename                       = var.package_file
  source_code_hash               = filebase64sha256(var.package_file)
  handler                        = var.handler
  runtime                        = var.runtime
  architectures                  = [var.architecture]
  timeout                        = var.timeout_seconds
  memory_size                    = var.memory_mb
  reserved_concurrent_executions = var.reserved_concurrency
  kms_key_arn                    = var.kms_key_arn

  environment {
    variables = var.environment
  }

  tracing_config {
    mode = "PassThrough"
  }

  tags       = var.tags
  depends_on = [aws_cloudwatch_log_group.this, aws_iam_role_policy.this]
}
