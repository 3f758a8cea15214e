variable "project_id" {
  description = "Equinix Metal project."
  type        = string
}

variable "metro" {
  description = "Equinix Metal metro, e.g. da, am, sg."
  type        = string
  default     = "da"
}

variable "broker_plan" {
  description = "Device plan of broker hosts (with NVMe data disks)."
  type        = string
  default     = "s3.xlarge.x86"
}

variable "data_disk_device" {
  description = "The NVMe data disk on the broker plan."
  type        = string
  default     = "/dev/nvme0n1"
}

variable "control_plane_url" {
  type = string
}

variable "operator_client_id" {
  type = string
}

variable "operator_client_secret" {
  type      = string
  sensitive = true
}

variable "broker_credentials" {
  type = object({
    access_key = string
    secret     = string
  })
  sensitive = true
}

variable "orbit_package" {
  type    = string
  default = "orbit-mq==0.1.0"
}

variable "ssh_private_key_file" {
  description = "Key of an SSH key registered with the Equinix Metal project."
  type        = string
  default     = "~/.ssh/id_ed25519"
}
