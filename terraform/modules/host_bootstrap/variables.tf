variable "description" {
  description = "One line naming what the host runs (the script's header)."
  type        = string
}

variable "files" {
  description = "Files the script writes (configuration, systemd units): absolute path, mode and content. No secrets: the script is an output."
  type = list(object({
    path    = string
    mode    = optional(string, "0644")
    content = string
  }))
  default = []
  validation {
    condition     = alltrue([for f in var.files : can(regex("^/[A-Za-z0-9_./@:+-]+$", f.path)) && can(regex("^0[0-7]{3}$", f.mode))])
    error_message = "Each file needs an absolute path of [A-Za-z0-9_./@:+-] and an octal mode such as 0644."
  }
}

variable "secret_files" {
  description = "Files uploaded separately into the staging directory (name) that the script moves to path, mode 0600, owned by the orbit user (credentials)."
  type = list(object({
    name = string
    path = string
  }))
  default = []
  validation {
    condition     = alltrue([for f in var.secret_files : can(regex("^[A-Za-z0-9_.-]+$", f.name)) && can(regex("^/[A-Za-z0-9_./@:+-]+$", f.path))])
    error_message = "A secret file needs a plain file name and an absolute path."
  }
}

variable "services" {
  description = "systemd units to enable and (re)start, each with the ready file it writes once it serves."
  type = list(object({
    unit       = string
    ready_file = string
  }))
  default = []
}

variable "orbit_dirs" {
  description = "Directories the orbit user owns (stores, run files)."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for d in var.orbit_dirs : can(regex("^/[A-Za-z0-9_./@:+-]+$", d))])
    error_message = "Directories must be absolute paths of [A-Za-z0-9_./@:+-]."
  }
}

variable "data_disk" {
  description = "The SSD/NVMe data disk to format (only when it holds no file system) and mount; null: none (the store lives on the root file system)."
  type = object({
    device        = string
    mount_point   = string
    filesystem    = optional(string, "ext4")
    mount_options = optional(list(string), ["defaults", "noatime", "nodiratime"])
  })
  default = null
  validation {
    condition = var.data_disk == null || (
      contains(["ext4", "xfs"], try(var.data_disk.filesystem, "")) &&
      can(regex("^/dev/[A-Za-z0-9_./-]+$", try(var.data_disk.device, ""))) &&
      can(regex("^/[A-Za-z0-9_./@:+-]+$", try(var.data_disk.mount_point, "")))
    )
    error_message = "data_disk needs a /dev/ device, an absolute mount point and filesystem ext4 or xfs."
  }
}

variable "io_scheduler" {
  description = "I/O scheduler of the data disk: auto (none for NVMe, mq-deadline otherwise), none, mq-deadline, kyber, bfq; \"\" leaves it alone."
  type        = string
  default     = "auto"
  validation {
    condition     = contains(["", "auto", "none", "mq-deadline", "deadline", "kyber", "bfq"], var.io_scheduler)
    error_message = "io_scheduler must be auto, none, mq-deadline, deadline, kyber, bfq or \"\"."
  }
}

variable "sysctls" {
  description = "Kernel settings on top of the defaults (RocketMQ's, see main.tf), written to /etc/sysctl.d/60-orbit.conf and applied; \"\" drops a default."
  type        = map(string)
  default     = {}
}

variable "nofile" {
  description = "Open-file limit of the orbit user (limits.d; the units set LimitNOFILE too)."
  type        = number
  default     = 655350
}

variable "disable_transparent_hugepages" {
  description = "Turn transparent huge pages off (they stall memory-mapped logs)."
  type        = bool
  default     = true
}

variable "orbit_user" {
  description = "System user the Orbit services run as (made when missing)."
  type        = string
  default     = "orbit"
  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.orbit_user))
    error_message = "orbit_user must be a plain user name."
  }
}

variable "install_dir" {
  description = "Virtual environment Orbit is installed into; its bin/orbit runs the services."
  type        = string
  default     = "/opt/orbit"
  validation {
    condition     = can(regex("^/[A-Za-z0-9_./@:+-]+$", var.install_dir))
    error_message = "install_dir must be an absolute path."
  }
}

variable "orbit_package" {
  description = "What pip installs into install_dir: a requirement (orbit-mq==0.1.0) or a wheel's path or URL."
  type        = string
  default     = "orbit-mq"
}

variable "install_command" {
  description = "A shell command installing Orbit instead of pip (e.g. from your own package repository); it must leave install_dir/bin/orbit."
  type        = string
  default     = ""
}

variable "staging_dir" {
  description = "Where the provisioners upload the script and the secret files."
  type        = string
  default     = "/tmp/orbit-bootstrap"
}

variable "start_timeout_s" {
  description = "How long the script waits for each service to serve (a broker with a large store recovers first)."
  type        = number
  default     = 600
}
