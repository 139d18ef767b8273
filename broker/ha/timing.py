"""The HA timers and the one clock assumption they rest on.

Every node measures time with its own monotonic clock (trio's clock is
``time.perf_counter``-style monotonic, never set back). Clocks may run at slightly different
rates: we assume each runs within ``CLOCK_RATE_BOUND`` of real time (5,000 ppm, ten times the
most an NTP daemon ever slews a clock; quartz drift is ~50 ppm). No clock has to agree with
another on the time of day.

From that bound: a lease of ``lease`` seconds granted by the witness from when it *received*
a renewal is trusted by the primary for ``lease * (1 - 2 * CLOCK_RATE_BOUND)`` seconds from
when it *sent* it. Whatever the two clocks' rates within the bound, the primary's trust ends
(in real time) no later than the witness' lease: ``(1 - 2r) / (1 - r) <= 1 / (1 + r)``.
The same margin applies to trust drawn from the standby's acknowledgements, which end
``failure_timeout`` after the acknowledged record was sent, because the standby waits
``failure_timeout`` of silence (by its clock) before it asks for a vote.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLOCK_RATE_BOUND", "DEFAULT_FAILURE_TIMEOUT", "DEFAULT_LEASE", "Timing"]

#: The largest difference of rate between any node's clock and real time (fraction).
CLOCK_RATE_BOUND = 0.005
#: Seconds the witness grants a lease for. With renewals every lease/3, two renewals in a
#: row may be lost before the primary is fenced.
DEFAULT_LEASE = 1.0
#: Seconds of silence from the primary after which the standby asks for a vote. Less than
#: the lease: the vote cannot be granted before the lease runs out anyway, so a shorter
#: timeout only makes the standby ready to ask when the witness is ready to grant.
DEFAULT_FAILURE_TIMEOUT = 0.6


@dataclass(frozen=True, slots=True)
class Timing:
    """The pair's timers (``[ha] lease`` and ``failure_timeout``) and what follows from them."""

    lease: float = DEFAULT_LEASE
    failure_timeout: float = DEFAULT_FAILURE_TIMEOUT

    def __post_init__(self) -> None:
        if not 0 < self.lease < 1e6:
            raise ValueError(f"lease must be a positive number of seconds, got {self.lease}")
        if not self.lease / 3 < self.failure_timeout < 1e6:
            raise ValueError(
                f"failure_timeout must be more than lease/3 ({self.lease / 3:g} s, the "
                f"interval between the primary's heartbeats), got {self.failure_timeout}"
            )

    @property
    def renew_interval(self) -> float:
        """Seconds between the primary's renewals (and between a candidate's vote requests)."""
        return self.lease / 3

    @property
    def trusted_lease(self) -> float:
        """Seconds the primary trusts a lease for, counted from when it sent the renewal."""
        return self.lease * (1 - 2 * CLOCK_RATE_BOUND)

    @property
    def trusted_sync(self) -> float:
        """Seconds the primary trusts a standby acknowledgement for, from the record's sending."""
        return self.failure_timeout * (1 - 2 * CLOCK_RATE_BOUND)

    def local_wait(self, wait: float) -> float:
        """A wait measured by the witness' clock, made long enough by ours."""
        return wait * (1 + 2 * CLOCK_RATE_BOUND)
