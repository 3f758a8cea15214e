output "endpoints" {
  description = "Name server addresses (host:port), for brokers' namesrv_addrs and clients."
  value       = [for s in local.servers : s.endpoint]
  precondition {
    condition     = !var.tenancy || var.control_plane_url != ""
    error_message = "A multi-tenant name server (tenancy = true) checks credentials: it needs control_plane_url."
  }
}

output "namesrv_addr" {
  description = "The same, ';'-separated (RocketMQ clients' namesrvAddr, ORBIT_NAMESRV)."
  value       = join(";", [for s in local.servers : s.endpoint])
}

output "systemd_units" {
  description = "Rendered systemd unit per host index."
  value       = local.units
}

output "bootstrap_scripts" {
  description = "Rendered bootstrap script per host index."
  value       = { for k, m in module.bootstrap : k => m.script }
}
