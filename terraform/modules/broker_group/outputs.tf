output "broker_group" {
  description = "The group: name, cluster, master and slave client addresses, the master's HA address, name servers."
  value = {
    name          = var.name
    cluster_name  = var.cluster_name
    master        = local.master.address
    slaves        = [for b in slice(local.brokers, 1, length(local.brokers)) : b.address]
    broker_addrs  = [for b in local.brokers : b.address]
    ha_address    = local.master.ha_address
    namesrv_addrs = var.namesrv_addrs
  }
}

output "brokers" {
  description = "Each broker: id, role, host, client and HA addresses, systemd unit, config path, store directory."
  value = [
    for b in local.brokers : {
      broker_id   = b.broker_id
      role        = b.broker_role
      host        = b.hostname
      address     = b.address
      ha_address  = b.ha_address
      unit        = b.unit
      config_path = b.config_path
      store_dir   = b.store_dir
    }
  ]
}

output "control_plane_url" {
  description = "The control plane the brokers use (\"\" without tenancy)."
  value       = var.control_plane_url
}

output "namesrv_addrs" {
  description = "The name servers the brokers register with."
  value       = var.namesrv_addrs
}

output "broker_configs" {
  description = "Rendered broker TOML per broker id (\"0\" the master). No secrets: the credential is a separate file."
  value       = local.configs
}

output "systemd_units" {
  description = "Rendered systemd unit per broker id."
  value       = local.units
}

output "bootstrap_scripts" {
  description = "Rendered host bootstrap script per broker id (what the provisioners run; usable as cloud-init user data with the credential file placed in the staging directory)."
  value       = { for k, m in module.bootstrap : k => m.script }
}
