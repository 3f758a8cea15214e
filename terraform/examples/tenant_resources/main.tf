# A tenant's resources as code, with the Orbit provider (installed from a filesystem mirror, see
# docs/terraform.md#installing-the-provider). An operator credential makes the tenant and its quota;
# the rest also works with the tenant's own credential (then leave `tenant` out everywhere).

terraform {
  required_version = ">= 1.5"
  required_providers {
    orbit = {
      source  = "orbit-mq/orbit"
      version = "~> 0.1"
    }
  }
}

# endpoint, client_id and client_secret from ORBIT_CONTROL_PLANE_URL, ORBIT_CLIENT_ID and
# ORBIT_CLIENT_SECRET (never write the secret into a .tf file)
provider "orbit" {}

resource "orbit_tenant" "acme" {
  name         = "acme"
  display_name = "ACME Corp"
  plan         = "standard"
}

resource "orbit_quota" "acme" {
  tenant              = orbit_tenant.acme.name
  max_topics          = 50
  publish_msgs_per_s  = 20000
  unlimited_retention = true         # the standard plan keeps messages at most 168 hours
  max_tiered_bytes    = 107374182400 # 100 GiB in object storage
}

resource "orbit_topic" "orders" {
  tenant                     = orbit_tenant.acme.name
  name                       = "orders"
  message_type               = "NORMAL"
  retention_hours            = 72
  local_retention_hours      = 24   # the last day on the brokers' disks, all 72 hours in object storage
  throughput_hint_msgs_per_s = 8000 # 8 queues
  description                = "order events"
}

resource "orbit_topic" "audit" {
  tenant              = orbit_tenant.acme.name
  name                = "audit"
  unlimited_retention = true # kept for good: allowed by the quota above
  depends_on          = [orbit_quota.acme]
}

resource "orbit_topic" "payments" {
  tenant       = orbit_tenant.acme.name
  name         = "payments"
  message_type = "TRANSACTION"
}

resource "orbit_consumer_group" "billing" {
  tenant       = orbit_tenant.acme.name
  name         = "billing"
  retry_policy = "exponential"
  max_retries  = 8
}

# The orders service: publishes orders, consumes payments as group billing.
resource "orbit_credential" "orders_service" {
  tenant      = orbit_tenant.acme.name
  description = "orders service"
  # with secret_file the secret goes to that file (0600) instead of the Terraform state
  # secret_file = "${path.root}/secrets/orders-service.json"
}

resource "orbit_acl" "orders_service" {
  tenant     = orbit_tenant.acme.name
  access_key = orbit_credential.orders_service.access_key

  grant {
    resource = "topic"
    pattern  = orbit_topic.orders.name
    actions  = ["publish"]
  }
  grant {
    resource = "topic"
    pattern  = orbit_topic.payments.name
    actions  = ["subscribe"]
  }
  grant {
    resource = "group"
    pattern  = orbit_consumer_group.billing.name
    actions  = ["subscribe"]
  }
}

data "orbit_endpoints" "this" {}
