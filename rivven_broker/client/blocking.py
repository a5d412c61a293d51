"""The blocking client: ``Producer``, ``Consumer`` and ``Admin`` for ordinary Python code.

Theory of operation
-------------------
This module only gathers the blocking driver's public classes; each lives in its own module:
``_producer`` (``send`` on any thread, a sender thread for I/O), ``_consumer`` (``poll`` on the
user's thread, a prefetching fetch thread), ``_admin`` (request/response on the caller's
thread), all over ``_network`` (non-blocking sockets, pipelining, reconnects) and the pure
client core (``core``). Threads and sockets are allowed in these driver files and only there
(the tidy test names them in ``CLIENT_DRIVERS``); every decision is made by the pure core.
"""

from __future__ import annotations

from rivven_broker.client._admin import Admin
from rivven_broker.client._consumer import Consumer
from rivven_broker.client._network import BrokerConnection, NetworkClient
from rivven_broker.client._producer import DeliveryCallback, Producer
from rivven_broker.client._sync import SyncClient

#: ``SyncClient`` is the raw request/response layer (bootstrap, metadata, retries) for callers
#: that move record batches as bytes themselves, such as the Spark executors.
__all__ = [
    "Producer",
    "Consumer",
    "Admin",
    "DeliveryCallback",
    "BrokerConnection",
    "NetworkClient",
    "SyncClient",
]
