# Renders the host bootstrap script (no resources): broker_group and name_server run it over SSH.

locals {
  # RocketMQ's recommendations for broker hosts (its distribution's os.sh): a broker keeps its logs
  # in the page cache and flushes them itself, so dirty pages may pile up (ratios 50, writeback
  # every hour); it maps many files (max_map_count); it must never be swapped out (swappiness 1,
  # not 0: 0 can invoke the OOM killer early) nor refused memory it maps (overcommit 1).
  default_sysctls = {
    "vm.overcommit_memory"         = "1"
    "vm.swappiness"                = "1"
    "vm.max_map_count"             = "655360"
    "vm.dirty_background_ratio"    = "50"
    "vm.dirty_ratio"               = "50"
    "vm.dirty_writeback_centisecs" = "360000"
    "vm.page-cluster"              = "3"
    "vm.zone_reclaim_mode"         = "0"
  }
  sysctls = { for k, v in merge(local.default_sysctls, var.sysctls) : k => v if v != "" }

  # The data disk's whole device gets the scheduler (a partition's parent is found on the host).
  scheduler_devices = var.data_disk != null && var.io_scheduler != "" ? [var.data_disk.device] : []

  script = templatefile("${path.module}/bootstrap.sh.tftpl", {
    description                   = var.description
    staging_dir                   = var.staging_dir
    orbit_user                    = var.orbit_user
    data_disk                     = var.data_disk
    scheduler_devices             = local.scheduler_devices
    io_scheduler                  = var.io_scheduler
    sysctls                       = local.sysctls
    nofile                        = var.nofile
    disable_transparent_hugepages = var.disable_transparent_hugepages
    install_command               = var.install_command
    install_dir                   = var.install_dir
    orbit_package                 = var.orbit_package
    orbit_dirs                    = var.orbit_dirs
    files                         = var.files
    secret_files                  = var.secret_files
    services                      = var.services
    start_timeout_s               = var.start_timeout_s
  })
}
