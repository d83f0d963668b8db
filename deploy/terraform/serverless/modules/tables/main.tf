# DynamoDB tables read and written by agentkernel. Key names and the TTL attribute are the ones
# the stores use (src/agentkernel/pipeline/response_store/dynamodb.py, src/agentkernel/session/
# dynamodb.py); tests/deploy checks they stay in step. The session table has the global secondary
# index the sessions API lists an identity's sessions by (OWNER_INDEX in the session store).

locals {
  tables = merge(
    { response = { name = "${var.name_prefix}-responses", hash_key = "request_id" } },
    var.create_session_table ? { session = { name = "${var.name_prefix}-sessions", hash_key = "session_id" } } : {},
    var.create_connections_table ? { connections = { name = "${var.name_prefix}-ws-connections", hash_key = "connection_id" } } : {},
  )
}

resource "aws_dynamodb_table" "table" {
  for_each = local.tables

  name         = each.value.name
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = each.value.hash_key

  attribute {
    name = each.value.hash_key
    type = "S"
  }

  dynamic "attribute" {
    for_each = each.key == "session" ? { owner_scope = "S", active_at = "N" } : {}
    content {
      name = attribute.key
      type = attribute.value
    }
  }

  dynamic "global_secondary_index" {
    for_each = each.key == "session" ? ["by_owner"] : []
    content {
      name            = global_secondary_index.value
      hash_key        = "owner_scope"
      range_key       = "active_at"
      projection_type = "KEYS_ONLY"
    }
  }

  ttl {
    attribute_name = "expiry_time"
    enabled        = true
  }

  point_in_time_recovery {
    enabled = var.point_in_time_recovery
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }

  deletion_protection_enabled = var.deletion_protection
  tags                        = var.tags
}
