"""The Orbit Terraform provider: the control plane's API (tenants, topics, consumer groups,
credentials, ACLs, quotas, endpoints) as Terraform resources, written with the ``tf`` framework
(PyPI ``tf``: Terraform's plugin protocol 6 over gRPC). See docs/terraform.md.

Run by Terraform as ``python -m orbit_provider`` through the launcher that ``orbit_provider.mirror``
installs into a filesystem mirror; it needs only ``tf`` and the standard library.
"""

from __future__ import annotations

HOSTNAME = "registry.terraform.io"
NAMESPACE = "orbit-mq"
TYPE = "orbit"
VERSION = "0.1.0"
SOURCE = f"{NAMESPACE}/{TYPE}"  # required_providers { orbit = { source = "orbit-mq/orbit" } }
ADDRESS = f"{HOSTNAME}/{SOURCE}"
