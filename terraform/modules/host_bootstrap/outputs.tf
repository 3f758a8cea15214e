output "script" {
  description = "The bootstrap script (POSIX sh, run as root)."
  value       = local.script
}

output "sysctls" {
  description = "The kernel settings the script applies."
  value       = local.sysctls
}
