"""The topiary broker: a trio shell around a protocol-agnostic core.

core/    router, sessions, shared groups, delivery (no I/O, no protocol)
store/   durable state in SQLite
wire/    the native protocol, sans-IO
native/  the trio front end for native clients
mesh/    peer links, route flooding, forwarding
client/  the native client library
server.py listens and shuts down; net.py, address.py the small shared I/O rules;
cli.py and commands.py the ``topiary`` command
"""
