# Task roles with the queue-mode guide's actions, each on its one resource, plus the two reads the
# code makes at start-up and in GET /ready: sqs:GetQueueAttributes (queue checks, lease length,
# depth metrics) and dynamodb:DescribeTable (response store ping), dynamodb:UpdateItem (the
# per-identity quota counts, one item per identity in the response table), and sqs:SendMessage
# to the dead-letter queue of the queue each role consumes (an undecodable message is copied
# there at once). The IO role also reads, lists (the owner index) and erases sessions for the
# sessions API; both roles keep the turn signals in the session table (turn control). tests/deploy
# checks the lists.

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "execution" {
  name               = "${var.name}-execution"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:aws:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

resource "aws_iam_role" "io" {
  name               = "${var.name}-io-task"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "io" {
  count = var.queue_mode ? 1 : 0

  statement {
    sid       = "SendToInput"
    actions   = ["sqs:SendMessage", "sqs:GetQueueAttributes"]
    resources = [module.queues[0].input_queue_arn]
  }

  statement {
    sid = "ConsumeOutput"
    actions = [
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage",
      "sqs:ChangeMessageVisibility",
      "sqs:GetQueueAttributes",
    ]
    resources = [module.queues[0].output_queue_arn]
  }

  statement {
    sid       = "DeadLetterOutput" # an undecodable reply is copied to the DLQ at once
    actions   = ["sqs:SendMessage"]
    resources = [module.queues[0].output_dlq_arn]
  }

  statement {
    sid = "ResponseStore"
    actions = [
      "dynamodb:PutItem",
      "dynamodb:GetItem",
      "dynamodb:Query",
      "dynamodb:DeleteItem",
      "dynamodb:DescribeTable",
      "dynamodb:UpdateItem",
    ]
    resources = [module.tables[0].response_table_arn]
  }

  statement {
    # the sessions API: show, list by the owner index, erase (with the session's open turns);
    # turn control: open each turn, ask turns to stop
    sid = "SessionStore"
    actions = [
      "dynamodb:GetItem",
      "dynamodb:Query",
      "dynamodb:DeleteItem",
      "dynamodb:UpdateItem",
      "dynamodb:BatchWriteItem",
    ]
    resources = [module.tables[0].session_table_arn, "${module.tables[0].session_table_arn}/index/by_owner"]
  }
}

resource "aws_iam_role_policy" "io" {
  count = var.queue_mode ? 1 : 0

  name   = "${var.name}-io-task"
  role   = aws_iam_role.io.id
  policy = data.aws_iam_policy_document.io[0].json
}

resource "aws_iam_role" "runner" {
  count = var.queue_mode ? 1 : 0

  name               = "${var.name}-runner-task"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "runner" {
  count = var.queue_mode ? 1 : 0

  statement {
    sid = "ConsumeInput"
    actions = [
      "sqs:ReceiveMessage",
      "sqs:DeleteMessage",
      "sqs:ChangeMessageVisibility",
      "sqs:GetQueueAttributes",
    ]
    resources = [module.queues[0].input_queue_arn]
  }

  statement {
    sid       = "SendToOutput"
    actions   = ["sqs:SendMessage"]
    resources = [module.queues[0].output_queue_arn]
  }

  statement {
    sid       = "DeadLetterInput" # an undecodable turn is copied to the DLQ at once
    actions   = ["sqs:SendMessage"]
    resources = [module.queues[0].input_dlq_arn]
  }

  statement {
    # GetItem is also the session store's check at start-up and behind the runner's GET /ready;
    # turn control: start and close each turn (UpdateItem, DeleteItem), poll the stops asked
    # for the turns it runs (BatchGetItem)
    sid = "SessionStore"
    actions = [
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
      "dynamodb:DeleteItem",
      "dynamodb:BatchGetItem",
    ]
    resources = [module.tables[0].session_table_arn]
  }
}

resource "aws_iam_role_policy" "runner" {
  count = var.queue_mode ? 1 : 0

  name   = "${var.name}-runner-task"
  role   = aws_iam_role.runner[0].id
  policy = data.aws_iam_policy_document.runner[0].json
}
