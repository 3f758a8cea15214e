output "namesrv_endpoints" {
  description = "Name server addresses (host:port)."
  value       = module.name_server.endpoints
}

output "namesrv_addr" {
  description = "The same, ';'-separated (ORBIT_NAMESRV, RocketMQ clients' namesrvAddr)."
  value       = module.name_server.namesrv_addr
}

output "broker_groups" {
  description = "Each broker group by name: master, slaves, broker and HA addresses."
  value       = { for name, g in module.broker_group : name => g.broker_group }
}

output "control_plane_url" {
  description = "The control plane the brokers use."
  value       = var.control_plane_url
}
