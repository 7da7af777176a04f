"""Engines that find each other by name through etcd (``metadata="etcd://host:port/ns"``)
against a real etcd that the fixture starts (skipped, saying why, where there is no etcd
binary), and the embedded default, which needs no service."""

import os

import pytest

import hmc
from conftest import OPTS


def test_two_engines_find_each_other_by_name_through_etcd(etcd):
    url = f"etcd://{etcd}/pytest"
    a, b = hmc.Engine(), hmc.Engine()
    a.initialize("127.0.0.1:0", OPTS, metadata=url, name="prefill-0")
    b.initialize("127.0.0.1:0", OPTS, metadata=url, name="decode-0")
    try:
        # The name is what peers connect to; no address changes hands.
        assert a.local_address == "prefill-0"
        assert b.local_address == "decode-0"
        src = bytearray(os.urandom(1 << 20))
        dst = bytearray(len(src))
        hs = a.register_mem(src)
        hd = b.register_mem(dst)
        b.connect("prefill-0", timeout_ms=10_000)
        desc = hmc.TransferOpDesc(hd.addr, hs.addr, len(src))
        b.transfer_sync("prefill-0", hmc.TransferOp.READ, [desc], timeout_ms=10_000)
        assert dst == src
        with pytest.raises(
            hmc.UnavailableError, match="no engine of that name is registered in etcd://"
        ):
            b.connect("nobody", timeout_ms=5_000)
    finally:
        a.finalize()
        b.finalize()


def test_the_keywords_and_the_options_are_the_same_setting(etcd):
    url = f"etcd://{etcd}/same"
    e = hmc.Engine()
    # Given both ways with the same value: fine.
    e.initialize("127.0.0.1:0", {**OPTS, "metadata": url}, metadata=url, name="x")
    assert e.local_address == "x"
    e.finalize()
    with pytest.raises(hmc.InvalidArgumentError, match="`metadata` is given twice"):
        hmc.Engine().initialize(
            "127.0.0.1:0", {**OPTS, "metadata": "embedded"}, metadata=url
        )


def test_the_embedded_default_needs_no_service():
    e = hmc.Engine()
    e.initialize("127.0.0.1:0", OPTS, metadata="embedded")
    try:
        # Without a directory, an engine's name is its address.
        host, port = e.local_address.rsplit(":", 1)
        assert host == "tcp://127.0.0.1" and int(port) > 0
    finally:
        e.finalize()
    with pytest.raises(hmc.InvalidArgumentError, match="needs a directory"):
        hmc.Engine().initialize("127.0.0.1:0", OPTS, metadata="embedded", name="x")
    with pytest.raises(hmc.InvalidArgumentError):
        hmc.Engine().initialize("127.0.0.1:0", OPTS, metadata="zookeeper://somewhere/x")
