"""A small SSH server on 127.0.0.1 for the Terraform modules' provisioners (asyncssh, in the
test's event loop): public-key login with one client key, a host key the client checks, SCP
uploads (the receiving end of ``scp -t``, which Terraform's ``file`` provisioner and
``remote-exec``'s script upload use) and exec requests, each command run by ``/bin/sh -c`` on
this machine as the test's user. Every command is recorded.

    async with ssh_server() as ssh:
        ssh.port, ssh.client_private_key, ssh.host_public_key, ssh.commands, ssh.uploads
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh


@dataclass
class SshServer:
    port: int
    client_private_key: str  # OpenSSH format, for Terraform's connection { private_key }
    host_public_key: str  # for connection { host_key }
    commands: list[str] = field(default_factory=list)
    uploads: list[tuple[str, bytes]] = field(default_factory=list)  # (path, content)


async def scp_sink(process: asyncssh.SSHServerProcess[bytes], target: Path, server: SshServer) -> int:
    """The receiving end of ``scp -t TARGET`` (files only: ``C<mode> <size> <name>`` records),
    as Terraform's SSH communicator uploads."""
    process.stdout.write(b"\0")
    while True:
        try:
            header = await process.stdin.readline()
        except asyncssh.BreakReceived:
            return 1
        if not header:
            return 0
        if not header.startswith(b"C"):
            process.stdout.write(b"\x01only files are supported\n")
            return 1
        mode, size, name = header[1:].decode().rstrip("\n").split(" ", 2)
        process.stdout.write(b"\0")
        data = await process.stdin.readexactly(int(size))
        await process.stdin.readexactly(1)  # the sender's 0 byte
        server.uploads.append((_store(target, name, data, int(mode, 8)), data))
        process.stdout.write(b"\0")


def _store(target: Path, name: str, data: bytes, mode: int) -> str:
    path = target / name if target.is_dir() else target
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


@contextlib.asynccontextmanager
async def ssh_server(host: str = "127.0.0.1") -> AsyncIterator[SshServer]:
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    server = SshServer(
        port=0,
        client_private_key=client_key.export_private_key("openssh").decode(),
        host_public_key=host_key.export_public_key("openssh").decode().strip(),
    )

    async def run(process: asyncssh.SSHServerProcess[bytes]) -> None:
        command = process.command or ""
        server.commands.append(command)
        args = shlex.split(command)
        flags = "".join(a[1:] for a in args[1:-1] if a.startswith("-"))
        if args[:1] == ["scp"] and "t" in flags:
            process.exit(await scp_sink(process, Path(args[-1]), server))
            return
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        process.stdout.write(out)
        process.exit(proc.returncode or 0)

    listener = await asyncssh.listen(
        host,
        0,
        server_host_keys=[host_key],
        authorized_client_keys=asyncssh.import_authorized_keys(client_key.export_public_key("openssh").decode()),
        process_factory=run,
        encoding=None,
        line_editor=False,
    )
    server.port = listener.get_port()
    try:
        yield server
    finally:
        listener.close()
        await listener.wait_closed()
