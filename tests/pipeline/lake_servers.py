"""Real servers for the Iceberg lake tests: moto's S3 emulator and a PostgreSQL catalog.

Both run as child processes on loopback, so a test can stop one (SIGSTOP/SIGKILL) and
start it again. moto checks credentials (``INITIAL_NO_AUTH_ACTION_COUNT``): the fixture
creates an IAM user with its access key, so a wrong key is refused as real S3 refuses it.
PostgreSQL comes from Debian's binaries (``initdb``/``pg_ctl``; .ci/run installs them);
as root it runs as the ``postgres`` user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import require_tool

#: Debian installs PostgreSQL's server binaries off PATH, under its major version.
PG_BIN = max(
    Path("/usr/lib/postgresql").glob("*/bin"),
    key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    default=Path("/usr/lib/postgresql/15/bin"),
)
BUCKET = "lake"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


@dataclass
class S3Server:
    """moto's standalone S3 server with one bucket and one IAM user's key."""

    process: subprocess.Popen[bytes]
    endpoint: str
    access_key_id: str
    secret_access_key: str

    def credentials_file(self, path: Path, *, secret: str | None = None) -> Path:
        """An AWS shared-credentials file for the user (``secret`` to spoil it)."""
        path.write_text(
            "[default]\n"
            f"aws_access_key_id = {self.access_key_id}\n"
            f"aws_secret_access_key = {secret or self.secret_access_key}\n"
        )
        return path

    def objects(self) -> list[str]:
        """Every key in the bucket."""
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name="us-east-1",
        )
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]


@pytest.fixture
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, credentials enforced."""
    import boto3

    moto = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    assert moto, "moto_server is missing: pip install 'moto[server]' (the dev extra)"
    port = free_port()
    process = subprocess.Popen(
        [moto, "-H", "127.0.0.1", "-p", str(port)],
        # The first three requests (the IAM user, its policy, its key) need no signature.
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port)
        endpoint = f"http://127.0.0.1:{port}"
        anonymous = {
            "endpoint_url": endpoint,
            "aws_access_key_id": "bootstrap",
            "aws_secret_access_key": "bootstrap",
            "region_name": "us-east-1",
        }
        iam = boto3.client("iam", **anonymous)
        iam.create_user(UserName="llmslo")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="llmslo", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="llmslo")["AccessKey"]
        server = S3Server(process, endpoint, key["AccessKeyId"], key["SecretAccessKey"])
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=server.access_key_id,
            aws_secret_access_key=server.secret_access_key,
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield server
    finally:
        process.kill()
        process.wait()


def _as_postgres_user() -> list[str]:
    """A command prefix that drops root (PostgreSQL refuses it); empty when not root."""
    if os.geteuid() != 0:
        return []
    setpriv = require_tool("setpriv")
    names = {entry.pw_name for entry in pwd.getpwall()}
    user = pwd.getpwnam("postgres" if "postgres" in names else "nobody")
    return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


@dataclass
class PostgresServer:
    """A PostgreSQL server from Debian's binaries, which a test may stop and start again
    (same data, same port): a catalog outage."""

    uri: str
    command: list[str]  # pg_ctl with its user prefix, data directory and options

    def stop(self) -> None:
        """Stop at once (``immediate``: as a crash does; clients' connections drop)."""
        subprocess.run([*self.command, "-m", "immediate", "stop"], capture_output=True)

    def start(self) -> None:
        """Start again and wait until it accepts connections."""
        subprocess.run([*self.command, "-w", "start"], check=True, capture_output=True)


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server on a free loopback port, removed on exit."""
    initdb = require_tool("initdb", str(PG_BIN / "initdb"))
    pg_ctl = require_tool("pg_ctl", str(PG_BIN / "pg_ctl"))
    # Not under pytest's tmp_path: its parents are private to root, and the server runs as
    # the postgres user.
    root = Path(tempfile.mkdtemp(prefix="llmslo-pg-"))
    data = root / "data"
    prefix = _as_postgres_user()
    data.mkdir(mode=0o700)
    if prefix:  # the server's user owns its data and writes its socket and log beside it
        os.chmod(root, 0o777)
        uid = int(prefix[1].split("=")[1])
        os.chown(data, uid, pwd.getpwuid(uid).pw_gid)
    subprocess.run(
        [*prefix, initdb, "-D", str(data), "-U", "llmslo", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    options = f"-p {port} -c listen_addresses=127.0.0.1 -k {root} -c fsync=off"
    server = PostgresServer(
        uri=f"postgresql://llmslo@127.0.0.1:{port}/postgres",
        command=[*prefix, pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "pg.log")],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres() -> Iterator[str]:
    """A real PostgreSQL server on a free loopback port; yields its catalog URI."""
    with running_postgres() as server:
        yield server.uri
