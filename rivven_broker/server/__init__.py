"""The trio broker: listeners, connections, request handlers, HTTP, metrics, configuration.

Theory of operation
-------------------
Thin trio drivers around the pure cores below them: ``Broker`` (``broker.py``) owns one node's
life (open and recover the logs, group commit, retention, the client and HTTP listeners,
graceful shutdown); ``connection.py`` drives the protocol's ``ServerConnection`` for one client;
``handlers.py`` and ``data_path.py`` answer requests against the ``LogManager``; ``http.py``
serves /health, /metrics and a dashboard with h11; ``metrics.py`` keeps one Prometheus registry
per broker; ``config.py`` turns flags and a TOML file into a ``BrokerConfig``;
``storage/partition.py`` keeps every partition's producer state (idempotence, open
transactions, LSO, snapshots) and ``txn_driver.py`` runs the transaction coordinator over
``__transaction_state`` (docs/exactly-once.md). Everything from
the outside world comes through an ``Env`` (``env.py``), so the simulator can run the same
code on virtual time, network and disk. Operating the broker: docs/operations.md.
"""

from rivven_broker.server.broker import Broker, BrokerAddresses, BrokerState
from rivven_broker.server.config import (
    BrokerConfig,
    ConfigError,
    HostPort,
    Peer,
    load_config,
)
from rivven_broker.server.env import Clock, Env, Net, RealClock, RealEnv, RealNet
from rivven_broker.server.metrics import BrokerMetrics

__all__ = [
    "Broker",
    "BrokerAddresses",
    "BrokerState",
    "BrokerConfig",
    "ConfigError",
    "HostPort",
    "Peer",
    "load_config",
    "BrokerMetrics",
    "Env",
    "Clock",
    "Net",
    "RealEnv",
    "RealClock",
    "RealNet",
]
