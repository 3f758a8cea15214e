# A broker group (a master and its slaves) on hosts that exist: each host gets its data disk,
# kernel settings, Orbit, the broker's TOML configuration and systemd unit over SSH, and the
# group and its hosts are registered with the control plane's fleet API. The brokers use one shared
# broker credential, or (per_host_credentials) each host its own, issued by the control plane.

locals {
  master_role  = coalesce(var.master_role, length(var.hosts) > 1 ? "SYNC_MASTER" : "ASYNC_MASTER")
  auth_enabled = var.control_plane_url != ""
  per_host     = var.per_host_credentials && local.auth_enabled
  register     = var.register && local.auth_enabled
  orbit_bin    = "${var.install_dir}/bin/orbit"
  # systemd makes (and keeps) a RuntimeDirectory under /run; any other run_dir is made by the script
  runtime_directory = startswith(var.run_dir, "/run/") ? trimprefix(var.run_dir, "/run/") : ""

  brokers = [
    for i, h in var.hosts : {
      key              = tostring(i)
      broker_id        = i
      broker_role      = i == 0 ? local.master_role : "SLAVE"
      ssh_host         = h.host
      advertised_host  = coalesce(h.advertised_host, h.host)
      hostname         = coalesce(h.hostname, h.advertised_host, h.host)
      data_disk_device = var.data_disk == null ? null : coalesce(h.data_disk_device, try(var.data_disk.device, null))
      unit             = "orbit-broker-${var.name}-${i}.service"
      config_path      = "${var.config_dir}/${var.name}-${i}.toml"
      store_dir        = "${var.store_root}/${var.name}-${i}"
      ready_file       = "${var.run_dir}/${var.name}-${i}.ready.json"
      address          = "${coalesce(h.advertised_host, h.host)}:${var.listen_port}"
      ha_address       = "${coalesce(h.advertised_host, h.host)}:${var.ha_port}"
      listen_host      = coalesce(var.listen_host, h.advertised_host, h.host)
      # the broker credential: the group's shared one, or this host's own
      credentials_name = var.per_host_credentials ? "${var.name}-${i}.credentials.json" : "${var.name}.credentials.json"
    }
  ]
  master = local.brokers[0]
  # per-host credentials pass through here on the machine running Terraform (0700), each file only
  # from its issue until its upload
  local_credentials_dir = "${abspath(path.root)}/.terraform/orbit-credentials"
  # the operator's side of register.py
  control_plane_env = {
    ORBIT_CONTROL_PLANE_URL = var.control_plane_url
    ORBIT_CLIENT_ID         = var.operator_client_id
    ORBIT_CLIENT_SECRET     = var.operator_client_secret
  }

  configs = {
    for b in local.brokers : b.key => templatefile("${path.module}/templates/broker.toml.tftpl", {
      broker_name             = var.name
      cluster_name            = var.cluster_name
      broker_id               = b.broker_id
      broker_role             = b.broker_role
      listen                  = "${b.listen_host}:${var.listen_port}"
      advertised_host         = b.advertised_host
      namesrv_addrs           = var.namesrv_addrs
      store_dir               = b.store_dir
      ha_listen               = "${b.listen_host}:${var.ha_port}"
      ha_master_address       = local.master.ha_address
      ha_sync_timeout_ms      = var.ha_sync_timeout_ms
      failover_enabled        = var.failover_enabled
      auth_enabled            = local.auth_enabled
      control_plane_url       = var.control_plane_url
      broker_credentials_file = local.auth_enabled ? "${var.config_dir}/${b.credentials_name}" : ""
      extra_settings          = var.extra_settings
      store_settings          = var.store_settings
      flush_disk_type         = var.flush_disk_type
    })
  }

  units = {
    for b in local.brokers : b.key => templatefile("${path.module}/templates/broker.service.tftpl", {
      broker_name       = var.name
      broker_id         = b.broker_id
      broker_role       = b.broker_role
      store_dir         = b.store_dir
      orbit_user        = var.orbit_user
      runtime_directory = local.runtime_directory
      orbit_bin         = local.orbit_bin
      config_path       = b.config_path
      ready_file        = b.ready_file
      nofile            = var.nofile
    })
  }
}

module "bootstrap" {
  source   = "../host_bootstrap"
  for_each = { for b in local.brokers : b.key => b }

  description = "Orbit broker ${var.name}, broker id ${each.value.broker_id} (${each.value.broker_role}) on ${each.value.hostname}"
  data_disk = each.value.data_disk_device == null ? null : {
    device        = each.value.data_disk_device
    mount_point   = var.store_root
    filesystem    = try(var.data_disk.filesystem, "ext4")
    mount_options = try(var.data_disk.mount_options, ["defaults", "noatime", "nodiratime"])
  }
  io_scheduler    = var.io_scheduler
  sysctls         = var.sysctls
  nofile          = var.nofile
  orbit_user      = var.orbit_user
  install_dir     = var.install_dir
  orbit_package   = var.orbit_package
  install_command = var.install_command
  staging_dir     = var.staging_dir
  start_timeout_s = var.start_timeout_s
  orbit_dirs      = concat([each.value.store_dir], local.runtime_directory == "" ? [var.run_dir] : [])
  files = [
    { path = each.value.config_path, mode = "0644", content = local.configs[each.key] }, # no secrets in it
    { path = "${var.unit_dir}/${each.value.unit}", mode = "0644", content = local.units[each.key] },
  ]
  secret_files = local.auth_enabled ? [{ name = each.value.credentials_name, path = "${var.config_dir}/${each.value.credentials_name}" }] : []
  services     = [{ unit = each.value.unit, ready_file = each.value.ready_file }]
}

# One per host: re-run when anything rendered for it changes (a changed config restarts its broker).
# With per-host credentials every run issues the host a new credential (revoking its previous one).
resource "terraform_data" "host" {
  for_each = var.provision ? { for b in local.brokers : b.key => b } : {}

  triggers_replace = {
    script = sha256(module.bootstrap[each.key].script)
    # a new shared broker credential is uploaded again (its hash only; the secret is never in state)
    credential = !local.auth_enabled ? "" : local.per_host ? "per-host" : sha256(jsonencode(var.broker_credentials))
  }
  # per-host credentials are issued only for hosts of a group the control plane knows
  depends_on = [terraform_data.group_first]

  connection {
    type         = "ssh"
    host         = each.value.ssh_host
    user         = var.ssh.user
    private_key  = var.ssh.private_key
    agent        = var.ssh.agent
    port         = var.ssh.port
    bastion_host = var.ssh.bastion_host
    bastion_user = var.ssh.bastion_user
    bastion_port = var.ssh.bastion_port
    host_key     = var.ssh.host_key
    timeout      = var.ssh.timeout
    script_path  = "${var.ssh.script_directory}/orbit-terraform-%RAND%.sh"
  }

  provisioner "remote-exec" {
    inline = ["umask 077 && mkdir -p ${var.staging_dir} && chmod 0700 ${var.staging_dir}"]
  }

  provisioner "file" {
    content     = module.bootstrap[each.key].script
    destination = "${var.staging_dir}/bootstrap.sh"
  }

  # per-host credentials: the control plane issues this host's into a local 0600 file
  provisioner "local-exec" {
    command = local.per_host ? "python3 ${path.module}/register.py" : "true"
    environment = local.per_host ? merge(local.control_plane_env, {
      ORBIT_HOST_CREDENTIAL = jsonencode({
        broker_group = var.name
        host         = each.value.advertised_host
        file         = "${local.local_credentials_dir}/${each.value.credentials_name}"
      })
    }) : {}
  }

  # (read when this provisioner runs, after the issue above)
  provisioner "file" {
    content     = !local.auth_enabled ? "{}" : local.per_host ? sensitive(file("${local.local_credentials_dir}/${each.value.credentials_name}")) : jsonencode(var.broker_credentials)
    destination = "${var.staging_dir}/${each.value.credentials_name}"
  }

  provisioner "local-exec" {
    command = local.per_host ? "rm -f '${local.local_credentials_dir}/${each.value.credentials_name}'" : "true"
  }

  provisioner "remote-exec" {
    inline = [
      "${var.ssh.user == "root" ? "" : "sudo "}env ${join(" ", [for k, v in var.bootstrap_env : "${k}=${v}"])} sh ${var.staging_dir}/bootstrap.sh",
      "rm -rf ${var.staging_dir}",
    ]
  }

  lifecycle {
    precondition {
      condition     = !local.auth_enabled || local.per_host || var.broker_credentials != null
      error_message = "With a control_plane_url the brokers need broker_credentials (a credential of role broker) or per_host_credentials."
    }
    precondition {
      condition     = !var.per_host_credentials || local.register
      error_message = "per_host_credentials needs a control_plane_url and register = true (the control plane issues the credentials of a registered group's hosts)."
    }
  }
}

# The group and its hosts in the control plane (idempotent: made, or brought up to date). With one
# shared credential: once the hosts serve.
resource "terraform_data" "registration" {
  count = local.register && !local.per_host ? 1 : 0

  triggers_replace = local.registration
  depends_on       = [terraform_data.host]

  provisioner "local-exec" {
    command     = "python3 ${path.module}/register.py"
    environment = merge(local.control_plane_env, { ORBIT_BROKER_GROUP = jsonencode(local.registration) })
  }

  lifecycle {
    precondition {
      condition     = var.operator_client_id != "" && var.operator_client_secret != ""
      error_message = "Registering with the control plane needs operator_client_id and operator_client_secret (or register = false)."
    }
  }
}

# The same with per-host credentials: before the hosts, which get credentials for their addresses
# in broker_addrs.
resource "terraform_data" "group_first" {
  count = local.register && local.per_host ? 1 : 0

  triggers_replace = local.registration

  provisioner "local-exec" {
    command     = "python3 ${path.module}/register.py"
    environment = merge(local.control_plane_env, { ORBIT_BROKER_GROUP = jsonencode(local.registration) })
  }

  lifecycle {
    precondition {
      condition     = var.operator_client_id != "" && var.operator_client_secret != ""
      error_message = "Registering with the control plane and issuing the hosts' credentials needs operator_client_id and operator_client_secret."
    }
  }
}

locals {
  registration = {
    name           = var.name
    namesrv_addrs  = var.namesrv_addrs
    broker_addrs   = [for b in local.brokers : b.address]
    max_queues     = var.capacity.max_queues
    max_msgs_per_s = var.capacity.max_msgs_per_s
    storage_bytes  = var.capacity.storage_bytes
    hosts          = [for b in local.brokers : { broker_id = b.broker_id, host = b.hostname, address = b.address }]
  }
}
