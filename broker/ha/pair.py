"""Running one broker of a hot-spare pair (``[ha]``): the standby until it is promoted,
and the replication a primary attaches to its store.

Promotion is by the witness (``[ha] failover = "witness"``, the default): the broker's
``Elector`` wins a vote, and the standby stops following, closes its store and serves as
the primary of the new term on the same data directory. With ``failover = "manual"``
SIGUSR1 does that instead, and nothing stops the old primary: the operator must have
stopped it (or cut it off) first (docs/ha.md).
"""

from __future__ import annotations

import signal
from functools import partial

import trio

from broker.address import parse_host_port
from broker.config import BrokerConfig
from broker.ha.door import StandbyDoor
from broker.ha.elector import Elector
from broker.ha.follower import Follower
from broker.ha.shipping import Shipper
from broker.ha.standby_http import standby_routes
from broker.ha.tls import PairTls
from broker.http.server import HttpServer
from broker.listeners import TLS_KINDS, Listeners
from broker.log import get_logger
from broker.security.reload import Reloadable, reload_all
from broker.store import Store

__all__ = ["standby_until_promoted", "start_shipping"]

log = get_logger("topiary.ha")


async def standby_until_promoted(
    config: BrokerConfig,
    *,
    handle_signals: bool,
    held: Listeners,
    elector: Elector | None = None,
    tls: PairTls | None = None,
) -> int | None:
    """Follow the primary and refuse clients until promoted: by the witness (``elector``)
    or, with manual failover, by SIGUSR1; return the term to serve in, or None on
    SIGINT/SIGTERM (stop). The door answers on the sockets the broker ``held`` since
    its start (broker/listeners.py), and leaves them open for the primary. ``tls``: the
    link's mutual TLS (SIGHUP reloads it meanwhile)."""
    assert config.ha_partner is not None and config.ha_secret is not None
    assert config.data_dir is not None
    partner = parse_host_port(config.ha_partner)
    assert partner is not None  # checked with the config
    follower = Follower(
        config.data_dir, config.ha_secret.encode(), dedup_window=config.dedup_window, tls=tls
    )
    follower.gate = elector
    door = StandbyDoor(
        config.ha_partner, config.hello_timeout, partial(_state, follower, elector), tls
    )
    promoted = False
    async with trio.open_nursery() as nursery:
        link = config.ha_partner_link
        await nursery.start(follower.run, partner[0], link)
        lent = held.lend()
        operators = [*lent.http, *lent.secure("http")]  # the door leaves these to us
        lent.http, lent.tls["http"] = [], []
        await nursery.start(door.serve, lent)
        if operators:
            http = HttpServer(
                standby_routes(follower, door, elector, config.ha_partner),
                request_timeout=config.http_request_timeout,
            )
            await nursery.start(http.serve, operators)
        if handle_signals:  # (SIGHUP's default action would end the process)
            nursery.start_soon(_reload_on_signal, _reloadable(held, tls))
        log.info("standby", primary=config.ha_partner, link=f"{partner[0]}:{link}",
                 seq=follower.position.seq)  # fmt: skip
        if elector is not None:
            promoted = await _promoted_or_stopped(elector, handle_signals)
        elif not handle_signals:
            await trio.sleep_forever()
        else:
            with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGINT, signal.SIGTERM) as got:
                async for signum in got:
                    promoted = signum == signal.SIGUSR1
                    log.info("signal", signal=signal.Signals(signum).name)
                    break
        nursery.cancel_scope.cancel()
    if not promoted:
        return None
    if elector is not None:
        log.warning("promoted by the witness", term=elector.term, seq=follower.position.seq)
        return elector.term
    term = follower.position.term + 1
    log.warning("promoted by the operator", term=term, seq=follower.position.seq)
    return term


def _state(follower: Follower, elector: Elector | None) -> str:
    """The standby's state as ``key=value`` words (its NOT_PRIMARY refusals carry them)."""
    heard = follower.last_contact
    since = -1.0 if heard is None else round(trio.current_time() - heard, 3)
    words = [
        f"seq={follower.position.seq}",
        f"connected={'yes' if follower.connected else 'no'}",
        f"seconds_since_contact={since}",
    ]
    if elector is not None:
        stats = elector.statistics()
        words[:0] = [f"ha_term={elector.term}", f"election={stats['role']}"]
        words.append(f"seconds_since_witness={round(float(stats['seconds_since_witness']), 3)}")
    return " ".join(words)


async def _promoted_or_stopped(elector: Elector, handle_signals: bool) -> bool:
    """True once the witness made this broker primary; False on SIGINT/SIGTERM."""
    promoted = False
    async with trio.open_nursery() as nursery:

        async def stop_on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as got:
                async for signum in got:
                    log.info("signal", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

        if handle_signals:
            nursery.start_soon(stop_on_signal)
        while not elector.is_primary:
            await elector.wait_changed()
        promoted = True
        nursery.cancel_scope.cancel()
    return promoted


def _reloadable(held: Listeners, tls: PairTls | None) -> list[Reloadable]:
    """What a standby re-reads at SIGHUP: the link's TLS files, and the client ports'
    certificate (its TLS ports are held, and the door handshakes on them)."""
    parts: list[Reloadable] = [] if tls is None else [tls]
    for kind in TLS_KINDS:
        for listener in held.secure(kind):
            if all(listener.tls is not part for part in parts):
                parts.append(listener.tls)
    return parts


async def _reload_on_signal(parts: list[Reloadable]) -> None:
    """SIGHUP on a standby: read its certificate files again (a primary's server reloads
    them with the rest, ``Server.reloadables``)."""
    with trio.open_signal_receiver(signal.SIGHUP) as received:
        async for _signum in received:
            log.info("signal", signal="SIGHUP")
            reload_all(parts)


async def start_shipping(
    config: BrokerConfig,
    store: Store,
    term: int | None,
    elector: Elector | None = None,
    tls: PairTls | None = None,
) -> Shipper:
    """A shipper attached to ``store`` in ``term`` (None: the term the store was in, at
    least 1), over mutual TLS with ``tls``. Serve its link with ``Shipper.serve``."""
    assert config.ha_secret is not None
    shipper = Shipper(
        term=term or 1, secret=config.ha_secret.encode(), sync=config.ha_sync, tls=tls
    )
    shipper.gate = elector
    await shipper.attach(store)
    if term is None and shipper.position.term > shipper.term:
        shipper.term = shipper.position.term
    return shipper
