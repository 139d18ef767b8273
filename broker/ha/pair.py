"""Running one broker of a hot-spare pair (``[ha]``): the standby until it is promoted,
and the replication a primary attaches to its store.

Promotion is manual in this version (``[ha] failover = "manual"``): SIGUSR1 to the standby
process makes it stop following, close its store and start serving as the primary of the
next term on the same data directory. Nothing stops the old primary: the operator must
have stopped it (or cut it off) first; docs/ha.md says why, and what the witness will add.
"""

from __future__ import annotations

import signal

import trio

from broker.address import parse_host_port
from broker.config import BrokerConfig
from broker.ha.door import StandbyDoor
from broker.ha.follower import Follower
from broker.ha.shipping import Shipper
from broker.log import get_logger
from broker.store import Store

__all__ = ["standby_until_promoted", "start_shipping"]

log = get_logger("topiary.ha")


async def standby_until_promoted(config: BrokerConfig, *, handle_signals: bool) -> int | None:
    """Follow the primary and refuse clients until SIGUSR1 (promotion: the term to serve
    in) or SIGINT/SIGTERM (None: stop)."""
    assert config.ha_partner is not None and config.ha_secret is not None
    assert config.data_dir is not None
    partner = parse_host_port(config.ha_partner)
    assert partner is not None  # checked with the config
    follower = Follower(
        config.data_dir, config.ha_secret.encode(), dedup_window=config.dedup_window
    )
    door = StandbyDoor(config.ha_partner, config.hello_timeout)
    native = await trio.open_tcp_listeners(config.port, host=config.host)
    mqtt = []
    if config.mqtt_listen is not None:
        host, port = parse_host_port(config.mqtt_listen) or ("", 0)
        mqtt = await trio.open_tcp_listeners(port, host=host or None)
    promoted = False
    async with trio.open_nursery() as nursery:
        await nursery.start(follower.run, partner[0], config.ha_link)
        await nursery.start(door.serve, native, mqtt)
        log.info("standby", primary=config.ha_partner, link=f"{partner[0]}:{config.ha_link}",
                 seq=follower.position.seq)  # fmt: skip
        if not handle_signals:
            await trio.sleep_forever()
        with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGINT, signal.SIGTERM) as got:
            async for signum in got:
                promoted = signum == signal.SIGUSR1
                log.info("signal", signal=signal.Signals(signum).name)
                break
        nursery.cancel_scope.cancel()
    if not promoted:
        return None
    term = follower.position.term + 1
    log.warning("promoted by the operator", term=term, seq=follower.position.seq)
    return term


async def start_shipping(config: BrokerConfig, store: Store, term: int | None) -> Shipper:
    """A shipper attached to ``store`` in ``term`` (None: the term the store was in, at
    least 1). Serve its link with ``Shipper.serve``."""
    assert config.ha_secret is not None
    shipper = Shipper(term=term or 1, secret=config.ha_secret.encode(), sync=config.ha_sync)
    await shipper.attach(store)
    if term is None and shipper.position.term > shipper.term:
        shipper.term = shipper.position.term
    return shipper
