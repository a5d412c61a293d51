"""``rivven-connect``: the connector runtime (docs/connect.md).

A separate process that moves data between outside systems and topics, talking to the broker
only through the client (``rivven_broker.client``). ``core/`` is sans-I/O: records and their
destinations, transforms, admission and the batch cycle as a state machine; the trio driver
runs it.
"""
