output "namesrv_addr" {
  description = "For clients and ORBIT_NAMESRV."
  value       = module.orbit.namesrv_addr
}

output "broker_groups" {
  value = module.orbit.broker_groups
}

output "control_plane_url" {
  value = module.orbit.control_plane_url
}
