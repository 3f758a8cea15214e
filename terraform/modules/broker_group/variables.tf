# --- the group ----------------------------------------------------------------------------------
variable "name" {
  description = "Broker name: the broker group's name in the control plane and on the name servers (e.g. broker-a)."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,64}$", var.name))
    error_message = "name must match ^[A-Za-z0-9_-]{1,64}$."
  }
}

variable "cluster_name" {
  description = "RocketMQ cluster name the brokers register under."
  type        = string
  default     = "DefaultCluster"
}

variable "hosts" {
  description = <<-EOT
    The group's hosts, master first (broker id 0), then its slaves (ids 1, 2, ...):
    host: the address Terraform connects to over SSH; advertised_host: the address clients and the
    other brokers use (default: host); hostname: the host's name in the control plane (default:
    advertised_host); data_disk_device: this host's data disk when it differs from data_disk.device.
  EOT
  type = list(object({
    host             = string
    advertised_host  = optional(string)
    hostname         = optional(string)
    data_disk_device = optional(string)
  }))
  validation {
    condition     = length(var.hosts) >= 1 && length(var.hosts) <= 16
    error_message = "A broker group has 1 to 16 hosts (a master and up to 15 slaves)."
  }
}

variable "master_role" {
  description = "SYNC_MASTER (a send is answered once a slave holds it) or ASYNC_MASTER; null: SYNC_MASTER when the group has slaves, else ASYNC_MASTER."
  type        = string
  default     = null
  validation {
    condition     = var.master_role == null || contains(["SYNC_MASTER", "ASYNC_MASTER"], coalesce(var.master_role, "-"))
    error_message = "master_role must be SYNC_MASTER or ASYNC_MASTER."
  }
}

variable "flush_disk_type" {
  description = "ASYNC_FLUSH (RocketMQ's choice with SYNC_MASTER: the slave's copy is the durability) or SYNC_FLUSH."
  type        = string
  default     = "ASYNC_FLUSH"
  validation {
    condition     = contains(["ASYNC_FLUSH", "SYNC_FLUSH"], var.flush_disk_type)
    error_message = "flush_disk_type must be ASYNC_FLUSH or SYNC_FLUSH."
  }
}

variable "listen_host" {
  description = "Interface the brokers listen on (clients and replication); null: each host's advertised_host."
  type        = string
  default     = "0.0.0.0"
}

variable "listen_port" {
  description = "Client port of every broker of the group."
  type        = number
  default     = 10911
}

variable "ha_port" {
  description = "The master's replication (HA) port; slaves connect to the master's advertised host on it."
  type        = number
  default     = 10912
}

variable "ha_sync_timeout_ms" {
  description = "SYNC_MASTER: how long a send waits for a slave before FLUSH_SLAVE_TIMEOUT."
  type        = number
  default     = 3000
}

variable "failover_enabled" {
  description = "Automatic failover through leases in the control plane (docs/ha.md)."
  type        = bool
  default     = false
}

variable "namesrv_addrs" {
  description = "Name servers (host:port) the brokers register with (e.g. module.name_server.endpoints)."
  type        = list(string)
  validation {
    condition     = length(var.namesrv_addrs) > 0 && alltrue([for a in var.namesrv_addrs : can(regex("^[A-Za-z0-9.:\\[\\]-]+:[0-9]{1,5}$", a))])
    error_message = "namesrv_addrs needs at least one host:port."
  }
}

# --- tenancy and the control plane ---------------------------------------------------------------
variable "control_plane_url" {
  description = "The control plane's URL (token keys, usage reports, registration); \"\": an open cluster without tenancy."
  type        = string
  default     = ""
  validation {
    condition     = var.control_plane_url == "" || can(regex("^https?://", var.control_plane_url))
    error_message = "control_plane_url must be an http(s) URL or \"\"."
  }
}

variable "broker_credentials" {
  description = "The brokers' own credential (role broker; e.g. an orbit_credential with role = \"broker\"): uploaded to each host as a 0600 file, never put in the rendered files. Needed with a control plane unless per_host_credentials."
  type = object({
    access_key = string
    secret     = string
  })
  default   = null
  sensitive = true
}

variable "per_host_credentials" {
  description = "Give each host its own broker credential: the group is registered first, then the control plane issues each host a credential bound to it (POST /v1/fleet/broker-groups/{group}/hosts/{host}/credential, rotated whenever the host is provisioned) that is uploaded as the host's 0600 file. Needs register and operator_client_id/secret; broker_credentials is then unused. false: every host gets broker_credentials."
  type        = bool
  default     = false
}

variable "register" {
  description = "Register the group and its hosts with the control plane's fleet API (needs operator_client_id/secret and python3 where Terraform runs)."
  type        = bool
  default     = true
}

variable "operator_client_id" {
  description = "Access key of an operator credential, for the registration."
  type        = string
  default     = ""
}

variable "operator_client_secret" {
  description = "Its secret (only in the registration command's environment; never in state)."
  type        = string
  default     = ""
  sensitive   = true
}

variable "capacity" {
  description = "What the control plane may place on the group."
  type = object({
    max_queues     = number
    max_msgs_per_s = number
    storage_bytes  = number
  })
  default = {
    max_queues     = 10000
    max_msgs_per_s = 100000
    storage_bytes  = 1099511627776
  }
}

# --- the hosts ---------------------------------------------------------------------------------
variable "data_disk" {
  description = "The SSD/NVMe data disk of each host (formatted only when it holds no file system, mounted on store_root with noatime,nodiratime); null: the store lives on the root file system."
  type = object({
    device        = string
    filesystem    = optional(string, "ext4")
    mount_options = optional(list(string), ["defaults", "noatime", "nodiratime"])
  })
  default = null
}

variable "io_scheduler" {
  description = "The data disk's I/O scheduler: auto (none for NVMe, mq-deadline otherwise), none, mq-deadline, kyber, bfq, or \"\" to leave it."
  type        = string
  default     = "auto"
}

variable "sysctls" {
  description = "Kernel settings on top of host_bootstrap's defaults (RocketMQ's: vm.swappiness=1, vm.max_map_count=655360, dirty ratios 50, ...); \"\" drops a default."
  type        = map(string)
  default     = {}
}

variable "store_root" {
  description = "Where stores live (the data disk's mount point): each broker's store_dir is store_root/<name>-<broker id>."
  type        = string
  default     = "/var/lib/orbit"
}

variable "config_dir" {
  description = "Where the broker configuration and credential files go."
  type        = string
  default     = "/etc/orbit"
}

variable "unit_dir" {
  description = "Where the systemd units go."
  type        = string
  default     = "/etc/systemd/system"
}

variable "run_dir" {
  description = "Where the brokers write their ready files (a /run/ directory is made by systemd)."
  type        = string
  default     = "/run/orbit"
}

variable "install_dir" {
  description = "Virtual environment Orbit is installed into (install_dir/bin/orbit runs the brokers)."
  type        = string
  default     = "/opt/orbit"
}

variable "orbit_package" {
  description = "What pip installs: a requirement (orbit-mq==0.1.0), a wheel path or URL."
  type        = string
  default     = "orbit-mq"
}

variable "install_command" {
  description = "Shell command installing Orbit instead of pip; must leave install_dir/bin/orbit."
  type        = string
  default     = ""
}

variable "orbit_user" {
  description = "System user the brokers run as."
  type        = string
  default     = "orbit"
}

variable "nofile" {
  description = "Open-file limit of the brokers."
  type        = number
  default     = 655350
}

variable "extra_settings" {
  description = "More broker settings (top-level keys of the broker's TOML, docs/broker.md), e.g. { trace_enabled = true }."
  type        = any
  default     = {}
}

variable "store_settings" {
  description = "More store settings ([store] table), e.g. { commit_log_file_size_bytes = 1073741824 }."
  type        = any
  default     = {}
}

# --- provisioning over SSH -------------------------------------------------------------------
variable "provision" {
  description = "Configure the hosts over SSH (Terraform's file and remote-exec provisioners). false: only render (the outputs), e.g. to feed cloud-init."
  type        = bool
  default     = true
}

variable "ssh" {
  description = "How Terraform reaches the hosts: user (root, or a sudoer), private_key (else the SSH agent), port, bastion, timeout."
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

variable "staging_dir" {
  description = "Directory on each host (made 0700) the bootstrap script and the credential file are uploaded to."
  type        = string
  default     = "/tmp/orbit-bootstrap"
}

variable "start_timeout_s" {
  description = "How long the bootstrap waits for a broker to serve (recovery of a large store comes first)."
  type        = number
  default     = 600
}

variable "bootstrap_env" {
  description = "Environment of the bootstrap script on the hosts, e.g. { ORBIT_BOOTSTRAP_DRY_RUN = \"1\" } to see what it would change (printed) without changing the machine."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for k, v in var.bootstrap_env : can(regex("^[A-Z_][A-Z0-9_]*$", k)) && can(regex("^[A-Za-z0-9_./:@+-]*$", v))])
    error_message = "bootstrap_env: NAME = plain value (letters, digits, _./:@+-)."
  }
}
