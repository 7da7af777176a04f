"""The RPC runtime from Python: :class:`Client` (raw ``call`` and the demo methods
``echo``, ``uppercase``, ``complex``) and :class:`Server`, whose methods are Python
callables ``handler(payload: bytes) -> bytes`` run on worker threads of their own.

Example::

    srv = hmc.rpc.Server("127.0.0.1:0")
    srv.register(1000, lambda payload: payload[::-1])
    srv.start()
    c = hmc.rpc.Client(srv.address)
    assert c.call(1000, b"abc") == b"cba"
    srv.shutdown()
"""

from ._hmc import Client, Server

#: Method id of the demo method ``echo``.
ECHO = 1
#: Method id of the demo method ``uppercase``.
UPPERCASE = 2
#: Method id of the demo method ``complex``.
COMPLEX = 3

__all__ = ["Client", "Server", "ECHO", "UPPERCASE", "COMPLEX"]
