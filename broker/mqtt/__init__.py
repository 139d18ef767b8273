"""MQTT 3.1, 3.1.1 and 5.0 for topiary: a sans-IO packet codec (``codec``) over packet values
(``packets``), property tables (``properties``) and reason codes (``reasons``).

Nothing here does I/O or imports trio; the front end (connection, sessions) sits on top.
"""
