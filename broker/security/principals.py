"""Whose topic ACL rules a durable session has while its owner is away.

A durable session keeps collecting messages when no connection holds it, after a restart
too, so it needs rules then: those of its owner as the broker knows it *now*. The store
keeps who the owner is (user name, and the certificate subject its latest connection
presented); the groups come from the users file in force, so a user taken out of a group
loses that group's rules at the next restart or SIGHUP, connected or not. A user the users
file no longer names (or any user, without a users file) cannot log in any more: the
session is nobody's, and gets only what an anonymous client would get (the ``*`` rules,
without those that use ``%u``). A certificate owner keeps its certificate's rules: the
broker cannot ask a certificate whether it is still valid until it is presented again.
"""

from __future__ import annotations

from broker.security.identity import ANONYMOUS, Identity
from broker.security.users import Users

__all__ = ["away_identity"]


def away_identity(owner: Identity, users: Users | None) -> Identity:
    """The identity whose rules apply to a session of ``owner`` (its user name and
    certificate; any groups it carries are ignored) while nobody is connected to it."""
    if owner.user is None:
        return Identity(cert=owner.cert)
    user = users.get(owner.user) if users is not None else None
    if user is None:
        return ANONYMOUS
    return Identity(user=owner.user, groups=user.groups, cert=owner.cert)
