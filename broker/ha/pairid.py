"""The id a hot-spare pair presents in the mesh when ``server_id`` is not set.

Both brokers of a pair must present one broker id to peers, observers (the Kafka bridge)
and clients: peers then see a failover as the same broker reconnecting (its routes
replaced), and a durable client's acks keep counting in the replicated sessions. The only
setting the two are sure to share is ``[ha] secret`` (the replication link and the witness
are authenticated with it), so the default id is derived from it. The id is shown to
every peer and client, so it is derived with scrypt (as password hashes are): guessing
the secret from it costs as much as guessing a password from its hash, and is no easier
than from the HMACs the witness link already carries. An operator who sets
``server_id`` (the same on both) gets a readable name instead.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

__all__ = ["pair_id"]

#: scrypt cost: ~16 MiB and a few tens of ms, once per process.
_N, _R, _P = 1 << 14, 8, 1
_SALT = b"topiary pair id v1"


@lru_cache(maxsize=4)
def pair_id(secret: str) -> str:
    """``pair-`` and 12 hex digits, the same for every broker given ``secret``."""
    digest = hashlib.scrypt(secret.encode(), salt=_SALT, n=_N, r=_R, p=_P, dklen=6)
    return f"pair-{digest.hex()}"
