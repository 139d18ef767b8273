"""Lean benchmark clients for topiary (native), MQTT 3.1.1 and NATS, with one interface.

- ``topics``: the filters and topics all three can express, and their translation;
- ``native``, ``mqtt``, ``nats``: sans-IO codecs (bytes in, events out), one per protocol;
- ``shell``: ``LeanClient``, the trio connection around any of them.

Measuring tools for bench/storm.py and bench/sidebyside.py, not the broker's own front
ends: just enough of each protocol for QoS 0 publish / subscribe, kept small so that the
clients cost each broker the same.
"""
