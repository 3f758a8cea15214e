"""The partition harness (docs/partitions.md): a broker group with failover whose members' paths
(control plane, HA, clients) run through TCP proxies a test drives, seeded schedules of cuts,
heals and kill -9, a recorder of every acknowledgement, a monitor of roles and epochs, and the
checks run after every schedule. ``tests/partition`` and ``orbit bench partitions`` use it."""
