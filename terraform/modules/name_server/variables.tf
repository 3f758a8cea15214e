variable "hosts" {
  description = "Name server hosts: host is where Terraform connects over SSH, advertised_host the address brokers and clients use (default: host)."
  type = list(object({
    host            = string
    advertised_host = optional(string)
  }))
  validation {
    condition     = length(var.hosts) >= 1
    error_message = "At least one name server host."
  }
}

variable "listen_host" {
  description = "Interface the name servers listen on; null: each host's advertised_host."
  type        = string
  default     = "0.0.0.0"
}

variable "listen_port" {
  description = "Name server port."
  type        = number
  default     = 9876
}

variable "tenancy" {
  description = "Multi-tenant cluster (orbit namesrv --tenancy): every request needs a credential, checked against the control plane's keys and the access keys and fleet its reconciler sends."
  type        = bool
  default     = true
}

variable "control_plane_url" {
  description = "The control plane (its JWKS verifies tokens); required with tenancy."
  type        = string
  default     = ""
}

variable "state_dir" {
  description = "Where a multi-tenant name server keeps the access keys (encrypted) and the fleet the control plane sends, across restarts."
  type        = string
  default     = "/var/lib/orbit/namesrv"
}

variable "extra_args" {
  description = "More orbit namesrv flags, e.g. [\"--broker-expiry-s\", \"120\"]."
  type        = list(string)
  default     = []
}

variable "sysctls" {
  description = "Kernel settings on top of host_bootstrap's defaults; \"\" drops a default."
  type        = map(string)
  default     = {}
}

variable "unit_dir" {
  description = "Where the systemd unit goes."
  type        = string
  default     = "/etc/systemd/system"
}

variable "run_dir" {
  description = "Where the name server writes its ready file (a /run/ directory is made by systemd)."
  type        = string
  default     = "/run/orbit"
}

variable "install_dir" {
  description = "Virtual environment Orbit is installed into (install_dir/bin/orbit)."
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
  description = "System user the name server runs as."
  type        = string
  default     = "orbit"
}

variable "nofile" {
  description = "Open-file limit."
  type        = number
  default     = 655350
}

variable "provision" {
  description = "Configure the hosts over SSH. false: only render (the outputs)."
  type        = bool
  default     = true
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

variable "staging_dir" {
  description = "Directory on each host (made 0700) the bootstrap script is uploaded to."
  type        = string
  default     = "/tmp/orbit-bootstrap"
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
