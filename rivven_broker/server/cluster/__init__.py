"""The broker's cluster drivers: membership (SWIM over UDP) and, later, the controller and
replication. Pure cores live in ``rivven_cluster``; these modules own sockets, files and time."""
