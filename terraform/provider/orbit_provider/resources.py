"""The provider's resources: orbit_tenant, orbit_topic, orbit_consumer_group, orbit_credential,
orbit_acl, orbit_quota and orbit_broker_host_credential.

Every operation goes to the control plane's API; an error answer becomes a Terraform diagnostic
carrying the API's code and message. ``read`` answers what the API holds now, so a change made
outside Terraform (through the API, the CLI, another tool) shows in the next ``terraform plan``,
and a resource deleted outside Terraform is planned to be made again.
"""

from __future__ import annotations

from orbit_provider.access_resources import Acl, BrokerHostCredential, Credential, Quota
from orbit_provider.resource_base import OrbitResource, attr
from orbit_provider.tenancy_resources import ConsumerGroup, Tenant, Topic

__all__ = [
    "RESOURCES",
    "Acl",
    "BrokerHostCredential",
    "ConsumerGroup",
    "Credential",
    "OrbitResource",
    "Quota",
    "Tenant",
    "Topic",
    "attr",
]

RESOURCES: tuple[type[OrbitResource], ...] = (
    Tenant,
    Topic,
    ConsumerGroup,
    Credential,
    Acl,
    Quota,
    BrokerHostCredential,
)
