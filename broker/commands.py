"""What every ``topiary`` subcommand shares, including the ones that plug in from outside.

Commands that live outside broker/ (the bridges') are found through the entry-point group
``COMMANDS_GROUP``: each entry is a callable that takes the subcommand action, adds its
parser and sets the defaults ``run`` (args -> exit code) and ``prog``; so broker/ never
imports them. They raise ``UsageError`` for a bad argument. (This is its own module, not
broker/cli.py, because ``python -m broker.cli`` runs that file as ``__main__``: a plugin
importing it would get a second, different ``UsageError``.)
"""

from __future__ import annotations

import argparse
import gc

from broker.address import split_address

COMMANDS_GROUP = "topiary.commands"


class UsageError(Exception):
    """A bad argument, reported as one line with exit status 2."""


def listen_address(text: str) -> str:
    """An argparse type: an address to listen on, HOST:PORT, port 0 for any free one."""
    try:
        split_address(text, default_port=None, listening=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def tune_gc() -> None:
    """A broker holds millions of long-lived objects (trie nodes, filters, sessions).

    With CPython's default thresholds every few hundred allocations trigger a young
    collection and full collections rescan the whole table; measured on 50,000 pipelined
    SUBs, the broker spent over half its time in the cyclic GC. Freezing what exists at
    start-up and collecting young objects every 10,000 allocations keeps pauses short and
    cuts that to a fraction. Every other young collection takes generation 1 along
    (threshold 0): with 10, every survivor was traversed twice before reaching generation
    2, once young and once among up to 110,000 others in a pause of ~0.1 s; now half of
    them are traversed once, and a generation-1 pass sees at most ~20,000 objects. Full
    collections (after 500 generation-1 passes, ~10 million survivors) stay about as rare
    as before (100 passes of 11 young collections).
    Only the serving process does this: the library leaves GC settings alone.
    """
    gc.freeze()
    gc.set_threshold(10_000, 0, 500)
