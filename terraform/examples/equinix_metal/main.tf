# Orbit's data plane on Equinix Metal: the devices come from the equinix provider and feed the
# same orbit_cluster module as hosts that exist. A documented example: it needs the equinix
# provider from the Terraform registry, so it is checked with `terraform fmt` only (see README.md).

terraform {
  required_version = ">= 1.5"
  required_providers {
    equinix = {
      source  = "equinix/equinix"
      version = ">= 1.30"
    }
  }
}

provider "equinix" {} # METAL_AUTH_TOKEN from the environment

locals {
  # broker hosts: s3.xlarge.x86 has NVMe data disks next to the boot disks
  brokers    = { "broker-a-0" = "broker-a", "broker-a-1" = "broker-a", "broker-b-0" = "broker-b", "broker-b-1" = "broker-b" }
  namesrvs   = ["namesrv-0", "namesrv-1"]
  group_keys = distinct(values(local.brokers))
}

resource "equinix_metal_device" "broker" {
  for_each         = local.brokers
  hostname         = "orbit-${each.key}"
  plan             = var.broker_plan
  metro            = var.metro
  operating_system = "ubuntu_22_04"
  billing_cycle    = "hourly"
  project_id       = var.project_id
}

resource "equinix_metal_device" "namesrv" {
  for_each         = toset(local.namesrvs)
  hostname         = "orbit-${each.key}"
  plan             = "c3.small.x86"
  metro            = var.metro
  operating_system = "ubuntu_22_04"
  billing_cycle    = "hourly"
  project_id       = var.project_id
}

module "orbit" {
  source = "../../modules/orbit_cluster"

  name_server_hosts = [
    for k in local.namesrvs : {
      host            = equinix_metal_device.namesrv[k].access_public_ipv4
      advertised_host = equinix_metal_device.namesrv[k].access_private_ipv4
    }
  ]

  # the master is <group>-0, its slave <group>-1
  broker_groups = {
    for g in local.group_keys : g => {
      hosts = [
        for i in [0, 1] : {
          host            = equinix_metal_device.broker["${g}-${i}"].access_public_ipv4
          advertised_host = equinix_metal_device.broker["${g}-${i}"].access_private_ipv4
          hostname        = equinix_metal_device.broker["${g}-${i}"].hostname
        }
      ]
    }
  }

  data_disk              = { device = var.data_disk_device, filesystem = "xfs" }
  control_plane_url      = var.control_plane_url
  operator_client_id     = var.operator_client_id
  operator_client_secret = var.operator_client_secret
  broker_credentials     = var.broker_credentials
  orbit_package          = var.orbit_package
  ssh = {
    user        = "root"
    private_key = file(pathexpand(var.ssh_private_key_file))
  }
}

output "namesrv_addr" {
  value = module.orbit.namesrv_addr
}

output "broker_groups" {
  value = module.orbit.broker_groups
}
