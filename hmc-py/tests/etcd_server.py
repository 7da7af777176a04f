"""A one-member etcd on loopback, for conftest's ``etcd`` fixture and for scripts
(``upstream/run_mooncake_suite.py``) that need one outside pytest."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time

# How long etcd may take to accept connections.
START_TIMEOUT_S = 30


class EtcdMissing(RuntimeError):
    """No etcd binary on this machine."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def etcd_binary() -> str:
    binary = os.environ.get("HMC_ETCD") or shutil.which("etcd")
    if binary is None:
        raise EtcdMissing("no etcd binary: apt-get install etcd-server (cargo xtask deps) or set HMC_ETCD")
    return binary


@contextlib.contextmanager
def running_etcd():
    """Starts etcd on free loopback ports in a temporary data directory; yields its client
    ``host:port``; kills it and removes the directory on exit."""
    binary = etcd_binary()
    with tempfile.TemporaryDirectory() as d:
        client = f"http://127.0.0.1:{free_port()}"
        peer = f"http://127.0.0.1:{free_port()}"
        log_path = os.path.join(d, "etcd.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [
                    binary,
                    "--name=hmc-py",
                    f"--data-dir={d}/data",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=hmc-py={peer}",
                    # Short election timings let short leases be granted.
                    "--heartbeat-interval=50",
                    "--election-timeout=500",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        endpoint = client.removeprefix("http://")
        host, port = endpoint.split(":")
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                try:
                    socket.create_connection((host, int(port)), timeout=0.2).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        with open(log_path) as f:
                            raise RuntimeError(f"etcd did not start: {f.read()}") from None
                    time.sleep(0.05)
            yield endpoint
        finally:
            proc.kill()
            proc.wait()
