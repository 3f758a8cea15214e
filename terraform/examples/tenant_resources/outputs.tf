output "namesrv_addr" {
  description = "Name servers for the RocketMQ clients (namesrvAddr)."
  value       = data.orbit_endpoints.this.namesrv_addr
}

output "token_url" {
  description = "Where the SDK gets tokens (OAuth2 client credentials)."
  value       = data.orbit_endpoints.this.token_url
}

output "orders_topic" {
  description = "The name clients use."
  value       = orbit_topic.orders.wire_name
}

output "orders_service_access_key" {
  value = orbit_credential.orders_service.access_key
}

output "orders_service_secret" {
  value     = orbit_credential.orders_service.secret
  sensitive = true # terraform output -raw orders_service_secret
}
