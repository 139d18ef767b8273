"""Security: who a client is (identities), what it may do (topic ACLs), how it proves it
(users file, client certificates over TLS), and reloading all of it at SIGHUP.

docs/security.md is the reference: the threat model, every setting, and how to run with
TLS and ACLs from scratch.
"""

from broker.security.identity import ANONYMOUS, Identity, certificate_subject
from broker.security.reload import Reloadable, reload_all

__all__ = ["ANONYMOUS", "Identity", "Reloadable", "certificate_subject", "reload_all"]
