# A whole data plane on hosts that exist: name servers, then broker groups registered with them
# and with the control plane.

module "name_server" {
  source = "../name_server"

  hosts             = var.name_server_hosts
  tenancy           = var.control_plane_url != ""
  control_plane_url = var.control_plane_url
  orbit_package     = var.orbit_package
  install_command   = var.install_command
  ssh               = var.ssh
  provision         = var.provision
}

module "broker_group" {
  source   = "../broker_group"
  for_each = var.broker_groups

  name                   = each.key
  hosts                  = each.value.hosts
  master_role            = each.value.master_role
  flush_disk_type        = each.value.flush_disk_type
  capacity               = coalesce(each.value.capacity, { max_queues = 10000, max_msgs_per_s = 100000, storage_bytes = 1099511627776 })
  extra_settings         = var.extra_settings
  store_settings         = var.store_settings
  namesrv_addrs          = module.name_server.endpoints
  control_plane_url      = var.control_plane_url
  broker_credentials     = var.broker_credentials
  per_host_credentials   = var.per_host_credentials
  register               = var.control_plane_url != ""
  operator_client_id     = var.operator_client_id
  operator_client_secret = var.operator_client_secret
  data_disk              = var.data_disk
  orbit_package          = var.orbit_package
  install_command        = var.install_command
  ssh                    = var.ssh
  provision              = var.provision

  # brokers register with running name servers
  depends_on = [module.name_server]
}
