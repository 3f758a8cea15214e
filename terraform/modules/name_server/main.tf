# Name servers on hosts that exist: Orbit, kernel settings and a systemd unit over SSH.

locals {
  orbit_bin         = "${var.install_dir}/bin/orbit"
  runtime_directory = startswith(var.run_dir, "/run/") ? trimprefix(var.run_dir, "/run/") : ""
  unit              = "orbit-namesrv.service"
  ready_file        = "${var.run_dir}/namesrv.ready.json"
  servers = [
    for i, h in var.hosts : {
      key      = tostring(i)
      ssh_host = h.host
      endpoint = "${coalesce(h.advertised_host, h.host)}:${var.listen_port}"
      listen   = "${coalesce(var.listen_host, h.advertised_host, h.host)}:${var.listen_port}"
    }
  ]
  units = { for s in local.servers : s.key => templatefile("${path.module}/templates/namesrv.service.tftpl", {
    listen            = s.listen
    tenancy           = var.tenancy
    control_plane_url = var.control_plane_url
    state_dir         = var.state_dir
    extra_args        = var.extra_args
    orbit_user        = var.orbit_user
    runtime_directory = local.runtime_directory
    orbit_bin         = local.orbit_bin
    ready_file        = local.ready_file
    nofile            = var.nofile
  }) }
}

module "bootstrap" {
  source   = "../host_bootstrap"
  for_each = { for s in local.servers : s.key => s }

  description     = "Orbit name server ${each.value.endpoint}"
  io_scheduler    = ""
  sysctls         = var.sysctls
  nofile          = var.nofile
  orbit_user      = var.orbit_user
  install_dir     = var.install_dir
  orbit_package   = var.orbit_package
  install_command = var.install_command
  staging_dir     = var.staging_dir
  start_timeout_s = 60
  orbit_dirs      = concat(local.runtime_directory == "" ? [var.run_dir] : [], var.tenancy ? [var.state_dir] : [])
  files           = [{ path = "${var.unit_dir}/${local.unit}", mode = "0644", content = local.units[each.key] }]
  services        = [{ unit = local.unit, ready_file = local.ready_file }]
}

resource "terraform_data" "host" {
  for_each = var.provision ? { for s in local.servers : s.key => s } : {}

  triggers_replace = sha256(module.bootstrap[each.key].script)

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

  provisioner "remote-exec" {
    inline = [
      "${var.ssh.user == "root" ? "" : "sudo "}env ${join(" ", [for k, v in var.bootstrap_env : "${k}=${v}"])} sh ${var.staging_dir}/bootstrap.sh",
      "rm -rf ${var.staging_dir}",
    ]
  }
}
