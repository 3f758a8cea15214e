terraform {
  # Only Terraform's built-ins: terraform_data, the ssh connection, file/remote-exec/local-exec.
  required_version = ">= 1.5"
}
