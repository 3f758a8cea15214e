variable "control_plane_url" {
  description = "The control plane's URL."
  type        = string
}

variable "operator_client_id" {
  description = "An operator credential's access key (registers the broker groups)."
  type        = string
}

variable "operator_client_secret" {
  description = "Its secret (TF_VAR_operator_client_secret)."
  type        = string
  sensitive   = true
}

variable "broker_credentials" {
  description = "The brokers' credential (role broker), e.g. from `POST /v1/admin/credentials {\"role\": \"broker\"}` or an orbit_credential with role = \"broker\"."
  type = object({
    access_key = string
    secret     = string
  })
  sensitive = true
}

variable "orbit_package" {
  description = "What pip installs on the hosts (a pinned version, or a wheel's URL)."
  type        = string
  default     = "orbit-mq==0.1.0"
}

variable "ssh_private_key_file" {
  description = "The SSH key Terraform connects with."
  type        = string
  default     = "~/.ssh/id_ed25519"
}
