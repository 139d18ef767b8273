"""Logins: from what a client presented (user name, password, client certificate) to an
``Identity``, or a refusal; the same rules for every front end.

- With a users file, a user name and password are checked against it (scrypt, in a
  worker thread bounded by a ``CapacityLimiter``: a login storm queues there, and the event
  loop goes on serving everyone else). A wrong password and an unknown user are the same
  failure, at the same cost.
- A client with a verified TLS client certificate and no user name is an identity of its
  own (``cert:SUBJECT``), even when anonymous access is off.
- Without user name or certificate a client is anonymous, allowed only when anonymous
  access is on: by default it is on without a users file and off with one
  (``[auth] anonymous`` says otherwise).
- Without a users file a user name cannot be checked, so it proves nothing and is ignored.

A failed login is logged (client id, peer, user name; never the password), counted
(``auth_failures``) and answered only after ``failure_delay`` seconds, which makes guessing
slow; the wait is the refused connection's alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

import trio

from broker.log import get_logger
from broker.security.identity import ANONYMOUS, Identity
from broker.security.users import Users

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.core.counters import Counters

__all__ = ["VERIFY_THREADS", "LoginRefused", "Logins"]

#: Password checks run at once: each holds a core for tens of ms, so more threads would
#: only slow every check down (and a storm would take the event loop's core too).
VERIFY_THREADS = 2

log = get_logger("topiary.auth")


class LoginRefused(Exception):
    """A login that failed. ``bad_credentials``: a user name or password was given and was
    wrong (MQTT: Bad User Name or Password); else nothing acceptable was presented (MQTT: Not
    Authorized)."""

    def __init__(self, text: str, *, bad_credentials: bool) -> None:
        super().__init__(text)
        self.text = text
        self.bad_credentials = bad_credentials


class Logins:
    """The broker's login rules (module docstring) and its users, if it has a users file."""

    def __init__(self, config: BrokerConfig, counters: Counters) -> None:
        self.users = Users(config.auth_users) if config.auth_users is not None else None
        anonymous = config.auth_anonymous
        self.anonymous = anonymous if anonymous is not None else self.users is None
        self.failure_delay = config.auth_failure_delay
        self.counters = counters
        self._limiter: trio.CapacityLimiter | None = None  # made inside trio, when first used

    async def login(
        self,
        *,
        username: str | None,
        password: bytes | None,
        cert: str | None,
        client_id: str | None,
        peer: str,
    ) -> Identity:
        """The identity these credentials prove; raises ``LoginRefused`` (after the failure
        delay) when they prove nothing this broker accepts."""
        users = self.users
        if username is None or users is None:
            if users is not None and password is not None:
                await self._fail("a password without a user name", True, client_id, peer, None)
            if cert is not None:
                return Identity(cert=cert)
            if self.anonymous:
                return ANONYMOUS
            await self._fail(
                "anonymous access is off: log in with a user name and password",
                False,
                client_id,
                peer,
                username,
            )
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(VERIFY_THREADS)
        user = await trio.to_thread.run_sync(
            users.check, username, password or b"", limiter=self._limiter
        )
        if user is None:
            await self._fail("bad user name or password", True, client_id, peer, username)
        self.counters.logins += 1
        log.debug("login", client=client_id, peer=peer, user=user.name)
        return Identity(user=user.name, groups=user.groups, cert=cert)

    async def refuse(
        self, text: str, *, client_id: str | None, peer: str, username: str | None = None
    ) -> NoReturn:
        """Fail a login the front end found malformed (credentials of the wrong type), as
        a bad password fails: logged, counted, delayed, ``LoginRefused``."""
        await self._fail(text, True, client_id, peer, username)

    async def _fail(
        self, text: str, bad: bool, client_id: str | None, peer: str, username: str | None
    ) -> NoReturn:
        self.counters.auth_failures += 1
        log.info("login failed", client=client_id, peer=peer, user=username, reason=text)
        await trio.sleep(self.failure_delay)
        raise LoginRefused(text, bad_credentials=bad)
