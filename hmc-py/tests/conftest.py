"""Shared fixtures: engines on loopback over the TCP transport, peer processes started with
multiprocessing's ``spawn`` method (the runtime's threads do not survive a fork), and a
real etcd on loopback (``etcd``)."""

import multiprocessing as mp
import os
import signal
import time

import pytest

import hmc
from etcd_server import EtcdMissing, running_etcd

#: Every test engine uses the TCP transport (UCX may be absent, and its tcp emulation
#: is slower to set up).
OPTS = {"transport": "tcp"}

ctx = mp.get_context("spawn")


def new_engine(**options):
    e = hmc.Engine()
    e.initialize("127.0.0.1:0", {**OPTS, **options})
    return e


@pytest.fixture
def pair():
    """Two connected engines in this process: (a, b), a connected to b."""
    a, b = new_engine(), new_engine()
    yield a, b
    a.finalize()
    b.finalize()


def stop_process(pid):
    """SIGSTOPs process ``pid`` and returns once every thread of it is stopped (the signal
    takes effect asynchronously: a thread already running may still answer a request)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(s == "T" for s in states):
            return
        time.sleep(0.01)
    raise AssertionError("the peer process did not stop")


class Peer:
    """A child process running ``target(conn, *args)``, talked to over a pipe."""

    def __init__(self, target, *args):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, *args), daemon=True)
        self.proc.start()
        child.close()

    def recv(self, timeout=30):
        if not self.conn.poll(timeout):
            raise AssertionError("the peer process did not answer in time")
        return self.conn.recv()

    def send(self, msg):
        self.conn.send(msg)

    def stop(self):
        """SIGSTOP: the peer stays connected and answers nothing."""
        stop_process(self.proc.pid)

    def cont(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)


@pytest.fixture
def peer_factory():
    peers = []

    def make(target, *args):
        p = Peer(target, *args)
        peers.append(p)
        return p

    yield make
    for p in peers:
        try:
            p.cont()
        except ProcessLookupError:
            pass
        p.close()


@pytest.fixture
def etcd():
    """A one-member etcd on loopback for this test: its ``host:port``."""
    try:
        with running_etcd() as endpoint:
            yield endpoint
    except EtcdMissing as e:
        pytest.skip(str(e))
