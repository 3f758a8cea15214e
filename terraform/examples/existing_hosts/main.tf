# Orbit's data plane on hosts that exist (bare metal with NVMe data disks), configured over SSH:
# two name servers and two broker groups, each a SYNC_MASTER and a SLAVE, registered with the
# control plane. Only Terraform's built-ins are used: `terraform init` needs no registry.

terraform {
  required_version = ">= 1.5"
}

module "orbit" {
  source = "../../modules/orbit_cluster"

  name_server_hosts = [
    { host = "203.0.113.10", advertised_host = "10.0.0.10" },
    { host = "203.0.113.11", advertised_host = "10.0.0.11" },
  ]

  broker_groups = {
    "broker-a" = {
      hosts = [
        { host = "203.0.113.20", advertised_host = "10.0.0.20", hostname = "bm-a1" }, # master
        { host = "203.0.113.21", advertised_host = "10.0.0.21", hostname = "bm-a2" }, # slave
      ]
      capacity = { max_queues = 8000, max_msgs_per_s = 200000, storage_bytes = 3500000000000 }
    }
    "broker-b" = {
      hosts = [
        { host = "203.0.113.30", advertised_host = "10.0.0.30", hostname = "bm-b1" },
        { host = "203.0.113.31", advertised_host = "10.0.0.31", hostname = "bm-b2" },
      ]
    }
  }

  data_disk = { device = "/dev/nvme1n1", filesystem = "xfs" }
  store_settings = {
    commit_log_file_size_bytes = 1073741824
  }

  control_plane_url      = var.control_plane_url
  operator_client_id     = var.operator_client_id
  operator_client_secret = var.operator_client_secret
  broker_credentials     = var.broker_credentials
  orbit_package          = var.orbit_package

  ssh = {
    user        = "ubuntu" # a sudoer; root works too
    private_key = file(pathexpand(var.ssh_private_key_file))
  }
}
