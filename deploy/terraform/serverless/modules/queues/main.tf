# INPUT and OUTPUT SQS FIFO queues with dead-letter queues.
#
# The redrive maxReceiveCount is the application's max_receive_count + 1: the Agent Runner answers
# the caller with an error reply on the delivery after its last allowed one, and only the delivery
# after that moves the message to the DLQ (docs/deploy-containerized.md).

locals {
  sse = var.kms_master_key_id == null
  queues = {
    input = {
      visibility_timeout_seconds = var.input_visibility_timeout_seconds
      max_receive_count          = var.input_max_receive_count
    }
    output = {
      visibility_timeout_seconds = var.output_visibility_timeout_seconds
      max_receive_count          = var.output_max_receive_count
    }
  }
}

resource "aws_sqs_queue" "dlq" {
  for_each = local.queues

  name                              = "${var.name_prefix}-${each.key}-dlq.fifo"
  fifo_queue                        = true
  content_based_deduplication       = false
  message_retention_seconds         = var.dlq_retention_seconds
  sqs_managed_sse_enabled           = local.sse ? true : null
  kms_master_key_id                 = var.kms_master_key_id
  kms_data_key_reuse_period_seconds = local.sse ? null : 300
  tags                              = var.tags
}

resource "aws_sqs_queue" "queue" {
  for_each = local.queues

  name                              = "${var.name_prefix}-${each.key}.fifo"
  fifo_queue                        = true
  content_based_deduplication       = false
  visibility_timeout_seconds        = each.value.visibility_timeout_seconds
  message_retention_seconds         = var.message_retention_seconds
  receive_wait_time_seconds         = 20
  sqs_managed_sse_enabled           = local.sse ? true : null
  kms_master_key_id                 = var.kms_master_key_id
  kms_data_key_reuse_period_seconds = local.sse ? null : 300
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq[each.key].arn
    maxReceiveCount     = each.value.max_receive_count + 1
  })
  tags = var.tags
}

resource "aws_sqs_queue_redrive_allow_policy" "dlq" {
  for_each = local.queues

  queue_url = aws_sqs_queue.dlq[each.key].id
  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.queue[each.key].arn]
  })
}
