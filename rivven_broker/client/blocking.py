"""The blocking client: ``Producer``, ``Consumer`` and ``Admin`` for ordinary Python code.

Theory of operation
-------------------
This module only gathers the blocking front's public classes. Each is a thin layer over the
one async driver (``_aio_*``, on AnyIO), which runs on a background event loop thread of the
object's own (``_loop_thread``): ``_producer`` (``send`` appends on the caller's thread under
the driver's lock), ``_consumer`` (``poll`` decodes on the caller's thread), ``_admin`` (the
async admin through the portal) and ``_sync`` (raw request/response, for the Spark executors).
Every decision is made by the pure client core.
"""

from __future__ import annotations

from rivven_broker.client._admin import Admin
from rivven_broker.client._consumer import Consumer
from rivven_broker.client._producer import DeliveryCallback, Producer
from rivven_broker.client._sync import SyncClient

#: ``SyncClient`` is the raw request/response layer (bootstrap, metadata, retries) for callers
#: that move record batches as bytes themselves, such as the Spark executors.
__all__ = [
    "Producer",
    "Consumer",
    "Admin",
    "DeliveryCallback",
    "SyncClient",
]
