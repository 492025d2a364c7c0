"""A private three-server MariaDB Galera cluster on loopback, for tests that lose a server.

Each server is a ``PrivateMariaDB`` (``--no-defaults``, temporary datadir, own port and
socket) with the Galera provider loaded and its own group-communication, IST and SST
ports. The first server bootstraps the cluster (``--wsrep-new-cluster``); the others join
it by rsync state transfer. Nothing here touches the shared server or the project's
development server.

    cluster = GaleraCluster.create(3)
    await cluster.start()          # returns once every server is Synced in one primary component
    cluster.servers[0].dsn()       # each server's own DSN
    cluster.dsn()                  # the multi-host DSN over all of them, in order
    await cluster.servers[0].kill9()
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import attrs
import trio

from orbit_node.db import Database
from orbit_node.domain.dsn import Dsn, DsnHost
from orbit_node.domain.errors import OrbitError

from .mariadb import START_TIMEOUT_S, PrivateMariaDB, find_bin
from .nodeproc import free_port

PROVIDER = Path("/usr/lib/galera/libgalera_smm.so")


def galera_missing() -> str | None:
    """Why a Galera cluster cannot run on this machine, or None when it can."""
    if not PROVIDER.exists():
        return f"galera-4 is not installed ({PROVIDER} missing; apt-get install galera-4)"
    if shutil.which("rsync") is None:
        return "rsync (Galera's state transfer) is not installed"
    try:
        find_bin("mariadbd")
    except RuntimeError:
        return "mariadbd is not installed"
    return None


@attrs.define(eq=False)
class GaleraServer(PrivateMariaDB):
    cluster_address: str = ""
    group_port: int = attrs.field(factory=free_port)
    ist_port: int = attrs.field(factory=free_port)
    sst_port: int = attrs.field(factory=free_port)
    name: str = "g"
    bootstrap: bool = False

    def needs_install(self) -> bool:
        # The first server is installed by the cluster; a joiner gets its data by transfer.
        return False

    def server_args(self) -> list[str]:
        return [
            "--binlog-format=ROW",
            "--innodb-autoinc-lock-mode=2",
            "--innodb-log-file-size=16M",
            "--wsrep-on=ON",
            f"--wsrep-provider={PROVIDER}",
            f"--wsrep-cluster-address={self.cluster_address}",
            "--wsrep-cluster-name=orbit-test",
            f"--wsrep-node-name={self.name}",
            f"--wsrep-node-address=127.0.0.1:{self.group_port}",
            f"--wsrep-provider-options=base_port={self.group_port};ist.recv_addr=127.0.0.1:{self.ist_port};"
            "evs.inactive_timeout=PT3S;evs.suspect_timeout=PT1.5S;evs.keepalive_period=PT0.5S;"
            "evs.inactive_check_period=PT0.5S;gcache.size=32M",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{self.sst_port}",
            "--wsrep-slave-threads=2",
            *(["--wsrep-new-cluster"] if self.bootstrap else []),
        ]

    async def wait_ready(self) -> None:
        """Up, and a Synced member of the primary component (it takes writes)."""
        admin = Database(self.dsn("mysql"), size=1, connect_timeout_s=1)
        try:
            with trio.fail_after(START_TIMEOUT_S):
                while True:
                    if self.process is not None and self.process.poll() is not None:
                        raise RuntimeError(f"mariadbd {self.name} exited: {self.log_tail()}")
                    try:
                        found = await admin.run(
                            lambda tx: tx.fetchall_raw(
                                "SHOW STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_local_state_comment')"
                            )
                        )
                        status = {r["Variable_name"]: r["Value"] for r in found}
                        if status == {"wsrep_ready": "ON", "wsrep_local_state_comment": "Synced"}:
                            return
                    except OrbitError:
                        pass
                    await trio.sleep(0.1)  # bounded poll: the server tells nothing else when it is synced
        finally:
            await admin.aclose()


@attrs.define(eq=False)
class GaleraCluster:
    servers: list[GaleraServer]

    @classmethod
    def create(cls, size: int = 3) -> GaleraCluster:
        servers = [GaleraServer(name=f"g{i + 1}") for i in range(size)]
        address = "gcomm://" + ",".join(f"127.0.0.1:{s.group_port}" for s in servers)
        for server in servers:
            server.cluster_address = address
        return cls(servers)

    def dsn(self, database: str = "orbit", order: list[int] | None = None) -> Dsn:
        chosen = [self.servers[i] for i in (order if order is not None else range(len(self.servers)))]
        return Dsn(
            user="root",
            password="",
            host="127.0.0.1",
            port=chosen[0].port,
            failover_hosts=tuple(DsnHost("127.0.0.1", s.port) for s in chosen[1:]),
            database=database,
        )

    async def start(self) -> None:
        first, *others = self.servers
        await first.install()
        first.bootstrap = True
        await first.start()
        await first.create_database()
        first.bootstrap = False
        for server in others:
            # A joiner's datadir is filled by the state transfer; it only needs to exist. The
            # rsync daemon of that transfer drops root to "nobody", which must reach and write it.
            server.datadir.mkdir(parents=True, exist_ok=True)
            server.root.chmod(0o711)
            if os.geteuid() == 0:
                nobody = pwd.getpwnam("nobody")
                os.chown(server.datadir, nobody.pw_uid, nobody.pw_gid)
            await server.start()

    async def stop(self) -> None:
        for server in reversed(self.servers):
            with trio.CancelScope(shield=True):
                await server.stop()

    def remove(self) -> None:
        for server in self.servers:
            server.remove()
