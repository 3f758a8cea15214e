variable "name_server_hosts" {
  description = "Name server hosts (see the name_server module)."
  type = list(object({
    host            = string
    advertised_host = optional(string)
  }))
}

variable "broker_groups" {
  description = <<-EOT
    Broker groups by name (e.g. broker-a): hosts, master first (see the broker_group module), and
    optionally master_role, flush_disk_type and capacity. (Settings that differ between groups: use
    the broker_group module directly.)
  EOT
  type = map(object({
    hosts = list(object({
      host             = string
      advertised_host  = optional(string)
      hostname         = optional(string)
      data_disk_device = optional(string)
    }))
    master_role     = optional(string)
    flush_disk_type = optional(string, "ASYNC_FLUSH")
    capacity = optional(object({
      max_queues     = number
      max_msgs_per_s = number
      storage_bytes  = number
    }))
  }))
}

variable "extra_settings" {
  description = "More broker settings for every group (top-level TOML keys), e.g. { trace_enabled = true }."
  type        = any
  default     = {}
}

variable "store_settings" {
  description = "More store settings for every group ([store] table)."
  type        = any
  default     = {}
}

variable "control_plane_url" {
  description = "The control plane's URL; \"\": an open cluster without tenancy (no registration)."
  type        = string
  default     = ""
}

variable "broker_credentials" {
  description = "The brokers' credential (role broker), uploaded to each broker host as a 0600 file (unused with per_host_credentials)."
  type = object({
    access_key = string
    secret     = string
  })
  default   = null
  sensitive = true
}

variable "per_host_credentials" {
  description = "Each broker host gets its own credential from the control plane instead of broker_credentials (see the broker_group module)."
  type        = bool
  default     = false
}

variable "operator_client_id" {
  description = "Operator credential for registering the broker groups."
  type        = string
  default     = ""
}

variable "operator_client_secret" {
  description = "Its secret."
  type        = string
  default     = ""
  sensitive   = true
}

variable "data_disk" {
  description = "Broker hosts' data disk (see the broker_group module); null: none."
  type = object({
    device        = string
    filesystem    = optional(string, "ext4")
    mount_options = optional(list(string), ["defaults", "noatime", "nodiratime"])
  })
  default = null
}

variable "orbit_package" {
  description = "What pip installs on every host."
  type        = string
  default     = "orbit-mq"
}

variable "install_command" {
  description = "Shell command installing Orbit instead of pip."
  type        = string
  default     = ""
}

variable "ssh" {
  description = "How Terraform reaches the hosts (see the broker_group module)."
  type = object({
    user             = optional(string, "root")
    private_key      = optional(string)
    agent            = optional(bool)
    port             = optional(number, 22)
    bastion_host     = optional(string)
    bastion_user     = optional(string)
    bastion_port     = optional(number)
    host_key         = optional(string)
    timeout          = optional(string, "5m")
    script_directory = optional(string, "/tmp")
  })
  default   = {}
  sensitive = true
}

variable "provision" {
  description = "Configure the hosts over SSH; false: only render."
  type        = bool
  default     = true
}
