"""Tenants through `mooring.store`: two tenants with their own credentials share a cluster and
never meet, and a credential acts only in its own tenant."""

from __future__ import annotations

import subprocess

import pytest
from conftest import Master, mooring_binary
from mooring.store import ErrorCode, MooncakeDistributedStore


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A master holding the cluster token, and a credential per tenant (node,client: each
    store contributes memory; team-b's may also remove everything of its own)."""
    dir = tmp_path_factory.mktemp("tenants")
    token = dir / "cluster.token"
    subprocess.run([mooring_binary(), "token", "new", str(token)], check=True)
    credentials = {}
    for tenant, roles in (("team-a", "node,client"), ("team-b", "node,client,admin")):
        path = dir / f"{tenant}.cred"
        subprocess.run(
            [
                mooring_binary(),
                "token",
                "issue",
                "--token-file",
                str(token),
                "--name",
                "engine",
                "--tenant",
                tenant,
                "--role",
                roles,
                str(path),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        credentials[tenant] = str(path)
    master = Master("--token-file", str(token))
    yield master, credentials
    master.stop()


def store_of(master, credential: str, tenant_id: str = "default") -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    code = store.setup(
        "127.0.0.1",
        "P2PHANDSHAKE",
        "16MB",
        "16MB",
        "tcp",
        "",
        master.address,
        tenant_id=tenant_id,
        token_file=credential,
    )
    assert code == 0, code
    return store


def test_two_tenants_never_meet(cluster):
    master, credentials = cluster
    a = store_of(master, credentials["team-a"], "team-a")
    # Mooncake's default tenant name means the credential's own.
    b = store_of(master, credentials["team-b"])
    try:
        assert a.put("shared-name", b"from a") == 0
        assert b.get("shared-name") == b""
        assert b.is_exist("shared-name") == 0
        assert b.put("shared-name", b"from b") == 0
        assert a.get("shared-name") == b"from a"
        assert b.get("shared-name") == b"from b"
        for i in range(3):
            assert a.put(f"a-{i}", b"v") == 0
        # Regex queries and removals see only the tenant's own keys.
        assert b.remove_by_regex("^a-") == 0
        assert a.batch_is_exist([f"a-{i}" for i in range(3)]) == [1, 1, 1]
        # remove_all needs the admin role, and removes only the tenant's own keys (not the
        # ones a read still leases: b's "shared-name").
        assert b.put("b-only", b"v") == 0
        assert a.remove_all() == ErrorCode.ILLEGAL_CLIENT
        assert b.remove_all() == 1
        assert b.is_exist("b-only") == 0
        assert a.get("shared-name") == b"from a"
        assert a.batch_is_exist([f"a-{i}" for i in range(3)]) == [1, 1, 1]
        # No key may name another tenant's namespace.
        assert a.put("team-b\x1fshared-name", b"x") == ErrorCode.INVALID_KEY
    finally:
        a.close()
        b.close()


def test_a_credential_acts_only_in_its_tenant(cluster):
    master, credentials = cluster
    store = MooncakeDistributedStore()
    code = store.setup(
        "127.0.0.1",
        "P2PHANDSHAKE",
        0,
        "16MB",
        "tcp",
        "",
        master.address,
        tenant_id="team-b",
        token_file=credentials["team-a"],
    )
    assert code == ErrorCode.INVALID_PARAMS
