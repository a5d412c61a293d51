"""The sans-I/O core of the connector runtime: no trio, no sockets, no clock (time comes in)."""
