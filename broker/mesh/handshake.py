"""The dialler's half of a peer handshake: send PEER_HELLO, read the answer.

A broker dialling a peer and the Kafka bridge's route watcher dialling its broker open a
link the same way; one copy keeps the timeout and the reading of the answer alike. What to
do with the answer (refusal, own id, which link to keep) stays with the caller.
"""

from __future__ import annotations

import trio

from broker.net import receive_frame
from broker.wire.connection import Connection
from broker.wire.frames import Error, PeerHello, PeerWelcome

#: How long a listener may take to answer PEER_HELLO before the dialler gives up.
HANDSHAKE_TIMEOUT = 10.0


async def dial_handshake(
    stream: trio.abc.Stream, proto: Connection, hello: PeerHello
) -> PeerWelcome | Error | None:
    """Send ``hello`` and return the listener's PEER_WELCOME or refusing ERROR; None when it
    hung up or said nothing within ``HANDSHAKE_TIMEOUT``. A malformed answer raises
    ``RemoteProtocolError``."""
    await stream.send_all(proto.send(hello))
    with trio.move_on_after(HANDSHAKE_TIMEOUT):
        frame = await receive_frame(proto, stream.receive_some)
        if isinstance(frame, PeerWelcome | Error):
            return frame
    return None
