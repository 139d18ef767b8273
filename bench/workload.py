"""A deterministic web-analytics workload for the routing benchmarks and tests.

Topics look like ``beacon/{region}/{country}/{site}/{section}/{event}``.

The *world* (which site lives in which region and country, and how popular
each site is) depends only on its size, ``n_sites`` (:data:`N_SITES` =
20,000 unless told otherwise), never on the seed, so subscriptions built with
one seed and topics built with another still talk about the same sites, as
long as both are given the same ``n_sites``. Growing the world appends sites:
site ``i`` has the same id, region and country in every world that holds it
(:func:`world` explains how), so the first 20,000 sites of a larger world are
the sites of the default one. Only the popularity ranking is redrawn per size.
Everything drawn from the world (topic streams, subscription sets) uses its
own ``random.Random`` seeded from ``seed`` and a label, never the global
random state, so the same arguments always give the same list. Every
function below takes ``n_sites`` as a keyword; left out, it is
:data:`N_SITES` and the lists are the ones this module always produced.

The benchmark scales the world with the table size (:func:`scaled_sites`):
a platform with a million subscriptions watches more sites than one with a
thousand, and with a fixed world the answer per match would grow with S.

- :func:`topics` is the cold stream: sites drawn Zipf-skewed (s = 1.1 over
  the ``n_sites`` sites), sections and events drawn with skewed weights. A
  long stream names tens of thousands of distinct topics (about 59,000 in
  200,000 draws over 20,000 sites), far more than a match cache holds.
- :func:`warm_topics` is the warm stream: the pages being hit right now. It
  picks ``hot`` distinct topics (1,000 by default) from the cold stream and
  draws from them with Zipf weights (s = 1.1 over their rank). A broker sees
  this repeat rate over a short window; with the table's default cache
  (4,096 entries) every hot topic fits, so the hit rate approaches
  ``1 - hot / n``.
- :func:`subscriptions` is a microservice-shaped subscription set: S
  (filter, subscriber, dialect) entries over about S/4 subscribers, each a
  tenant holding 1-7 filters, mostly about its own site (sites drawn uniformly
  over the world), plus a fixed handful of broad filters
  (:data:`BROAD_FILTERS`) held by a few platform services. So each site is
  watched by about ``S / n_sites`` tenant filters.
"""

from __future__ import annotations

import random
from functools import lru_cache
from itertools import accumulate

from routing import MQTT, NATIVE

WORLD_SEED = 20_240_611
N_SITES = 20_000  # the default world, and the smallest one scaled_sites() gives
SUBSCRIPTIONS_PER_SITE = 5  # scaled_sites(): S // 5 sites once S > 100,000
ZIPF_S = 1.1

REGIONS: dict[str, tuple[str, ...]] = {
    "eu": ("de", "fr", "gb", "it", "es", "nl", "se", "pl"),
    "na": ("us", "ca", "mx"),
    "sa": ("br", "ar", "cl", "co", "pe"),
    "ap": ("jp", "in", "au", "kr", "sg", "id"),
    "af": ("za", "ng", "ke", "eg"),
    "me": ("ae", "il", "tr", "qa"),
}
REGION_WEIGHTS: dict[str, float] = {"eu": 30, "na": 30, "ap": 20, "sa": 8, "me": 6, "af": 6}

# Traffic weights: pages and events a site actually sees, most common first.
SECTIONS: tuple[str, ...] = (
    "home", "product", "search", "blog", "cart", "account", "checkout", "help",
)  # fmt: skip
SECTION_WEIGHTS: tuple[float, ...] = (30, 25, 12, 10, 8, 5, 5, 5)
EVENTS: tuple[str, ...] = (
    "view", "impression", "click", "scroll", "add_to_cart", "login",
    "purchase", "error", "remove_from_cart", "signup",
)  # fmt: skip
EVENT_WEIGHTS: tuple[float, ...] = (40, 20, 15, 12, 4, 3, 2, 2, 1, 1)

# Prefix wildcards a tenant might write (native dialect only).
SECTION_PREFIXES: tuple[str, ...] = ("check", "prod", "acc", "c", "se")
EVENT_PREFIXES: tuple[str, ...] = ("add", "remove", "click", "purch", "log", "sign", "err")

# The broad filters: a fixed set (not a share of S) held by a few platform
# services. ``beacon/#`` matches every topic, so every answer is non-empty.
BROAD_FILTERS: tuple[tuple[str, str, str], ...] = (
    ("beacon/eu/>", "svc-analytics", NATIVE),
    ("beacon/na/us/>", "svc-analytics", NATIVE),
    ("beacon/ap/>", "svc-analytics", NATIVE),
    ("beacon/+/de/#", "svc-analytics", MQTT),
    ("beacon/*/*/*/*/purchase", "svc-revenue", NATIVE),
    ("beacon/*/*/*/checkout/>", "svc-revenue", NATIVE),
    ("beacon/*/*/*/cart/add_to_cart", "svc-revenue", NATIVE),
    ("beacon/*/*/*/*/sign*", "svc-growth", NATIVE),
    ("beacon/+/+/+/+/error", "svc-alerts", MQTT),
    ("beacon/#", "svc-archive", MQTT),
)

# Shares of the per-tenant filter shapes (sum 100).
SHAPES: tuple[tuple[str, float], ...] = (
    ("site", 40),  # beacon/{r}/{c}/{site}/>
    ("entity", 20),  # beacon/{r}/{c}/{site}/{section}/{event}
    ("any_place", 10),  # beacon/*/*/{site}/*/{event}
    ("prefix", 10),  # beacon/{r}/{c}/{site}/check*/>, .../*/add*, .../{section}/add*
    ("mqtt", 15),  # beacon/+/+/{site}/{section}/#, beacon/{r}/{c}/{site}/#, ...
    ("section", 5),  # beacon/{r}/{c}/{site}/{section}/*
)
FILTERS_PER_SUBSCRIBER = (1, 7)

Site = tuple[str, str, str]  # (site id, region, country)


def _cum(weights: tuple[float, ...] | list[float]) -> list[float]:
    return list(accumulate(weights))


_SHAPE_CUM = _cum([share for _, share in SHAPES])
_SECTION_CUM = _cum(SECTION_WEIGHTS)
_EVENT_CUM = _cum(EVENT_WEIGHTS)


def zipf_cum_weights(n: int, s: float = ZIPF_S) -> list[float]:
    """Cumulative Zipf weights for ranks 1..n, for ``Random.choices(cum_weights=...)``."""
    return _cum([1.0 / rank**s for rank in range(1, n + 1)])


def scaled_sites(size: int) -> int:
    """The world size the benchmark uses for a table of ``size`` subscriptions.

    ``max(N_SITES, size // 5)``: 20,000 sites up to S = 100,000, then one site
    per five subscriptions. Tenants pick their sites uniformly, so a site is
    watched by about ``S / n_sites`` tenant filters; in a fixed 20,000-site
    world that is 50 at S = 1,000,000 and the mean answer per match grows
    from 1.65 (S = 1,000) to 21.6, so cold matching at 1M would measure the
    cost of building 21-subscriber answers rather than the effect of S.
    Scaling the world keeps each site's number of watching filters (and so
    the answer size) comparable from S = 100,000 on, isolating the
    S-dependence; it is also what a larger platform looks like: a million
    subscriptions (about 250,000 subscribing services) watch a larger site
    population than a thousand do. Sizes up to 100,000 keep the default world,
    so their results do not change.
    """
    return max(N_SITES, size // SUBSCRIPTIONS_PER_SITE)


World = tuple[tuple[Site, ...], tuple[int, ...], tuple[float, ...]]


def world(n_sites: int = N_SITES) -> World:
    """The world of ``n_sites`` sites: ``(sites, popularity, cum_weights)``.

    ``sites[i]`` is ``(site_id, region, country)`` for site ``i``;
    ``popularity`` lists site indices from the most to the least visited;
    ``cum_weights`` are the Zipf weights over that ranking.

    Sites ``0 .. 19,999`` are drawn from ``Random(WORLD_SEED)`` (as they always
    were); sites from 20,000 on come from a second generator of their own, so
    growing the world appends sites and never moves one: ``world(n)[0]`` is a
    prefix of ``world(m)[0]`` for ``n <= m``. The popularity ranking is drawn
    per size (a shuffle of all ``n_sites`` indices by the first generator
    after its site draws), so a new site may be popular; for ``n_sites =
    N_SITES`` it is the ranking this module always had. Cached per size.
    """
    return _world(n_sites)


@lru_cache(maxsize=8)
def _world(n_sites: int) -> World:
    if n_sites < 1:
        raise ValueError("n_sites must be >= 1")
    rng = random.Random(WORLD_SEED)
    regions = list(REGIONS)
    region_cum = _cum([REGION_WEIGHTS[r] for r in regions])
    country_cum = {r: _cum([1.0 / (i + 1) for i in range(len(REGIONS[r]))]) for r in regions}

    def draw_sites(source: random.Random, first: int, end: int) -> None:
        for i in range(first, end):
            (region,) = source.choices(regions, cum_weights=region_cum)
            (country,) = source.choices(REGIONS[region], cum_weights=country_cum[region])
            sites.append((f"s{i:05d}", region, country))

    sites: list[Site] = []
    draw_sites(rng, 0, min(n_sites, N_SITES))
    if n_sites > N_SITES:
        draw_sites(random.Random(f"world:{WORLD_SEED}:appended"), N_SITES, n_sites)
    popularity = list(range(n_sites))
    rng.shuffle(popularity)
    return tuple(sites), tuple(popularity), tuple(zipf_cum_weights(n_sites))


@lru_cache(maxsize=8)
def _site_paths(n_sites: int) -> tuple[str, ...]:
    return tuple(f"beacon/{region}/{country}/{site}" for site, region, country in world(n_sites)[0])


def site_path(index: int, *, n_sites: int = N_SITES) -> str:
    """``beacon/{region}/{country}/{site}`` for site ``index`` of the ``n_sites`` world.

    A site's path is the same in every world that holds it.
    """
    return _site_paths(n_sites)[index]


def _draw_topics(rng: random.Random, n: int, n_sites: int) -> list[str]:
    _, popularity, cum = world(n_sites)
    chosen = rng.choices(popularity, cum_weights=cum, k=n)
    sections = rng.choices(SECTIONS, cum_weights=_SECTION_CUM, k=n)
    events = rng.choices(EVENTS, cum_weights=_EVENT_CUM, k=n)
    paths = _site_paths(n_sites)
    return [
        f"{paths[i]}/{section}/{event}"
        for i, section, event in zip(chosen, sections, events, strict=True)
    ]


def topics(n: int, seed: int = 0, *, n_sites: int = N_SITES) -> list[str]:
    """The cold stream: ``n`` topics, sites Zipf-skewed, sections and events skewed."""
    return _draw_topics(random.Random(f"topics:{seed}"), n, n_sites)


def hot_topics(hot: int = 1000, seed: int = 0, *, n_sites: int = N_SITES) -> list[str]:
    """``hot`` distinct topics, in order of first appearance in a Zipf stream."""
    rng = random.Random(f"hot:{seed}")
    found: dict[str, None] = {}
    while len(found) < hot:
        for topic in _draw_topics(rng, max(hot * 4, 1024), n_sites):
            found.setdefault(topic)
            if len(found) == hot:
                break
    return list(found)


def warm_topics(n: int, seed: int = 0, hot: int = 1000, *, n_sites: int = N_SITES) -> list[str]:
    """The warm stream: ``n`` draws from ``hot`` hot topics with Zipf weights (s = 1.1)."""
    pool = hot_topics(hot, seed, n_sites=n_sites)
    rng = random.Random(f"warm:{seed}:{hot}")
    return rng.choices(pool, cum_weights=zipf_cum_weights(len(pool)), k=n)


def _tenant_filter(rng: random.Random, site: int, kind: str, n_sites: int) -> tuple[str, str]:
    """One filter of shape ``kind`` (see :data:`SHAPES`) about ``site``."""
    site_id, region, country = world(n_sites)[0][site]
    base = f"beacon/{region}/{country}/{site_id}"
    if kind == "site":
        return f"{base}/>", NATIVE
    section = rng.choices(SECTIONS, cum_weights=_SECTION_CUM)[0]
    event = rng.choices(EVENTS, cum_weights=_EVENT_CUM)[0]
    if kind == "entity":
        return f"{base}/{section}/{event}", NATIVE
    if kind == "any_place":
        return f"beacon/*/*/{site_id}/*/{event}", NATIVE
    if kind == "section":
        return f"{base}/{section}/*", NATIVE
    if kind == "prefix":
        form = rng.randrange(3)
        if form == 0:
            return f"{base}/{rng.choice(SECTION_PREFIXES)}*/>", NATIVE
        if form == 1:
            return f"{base}/*/{rng.choice(EVENT_PREFIXES)}*", NATIVE
        return f"{base}/{section}/{rng.choice(EVENT_PREFIXES)}*", NATIVE
    assert kind == "mqtt"
    form = rng.randrange(4)
    if form == 0:
        return f"beacon/+/+/{site_id}/{section}/#", MQTT
    if form == 1:
        return f"{base}/#", MQTT
    if form == 2:
        return f"beacon/{region}/+/{site_id}/+/{event}", MQTT
    return f"{base}/{section}/{event}", MQTT


def subscriptions(
    size: int,
    seed: int = 0,
    *,
    prefix: str = "svc",
    broad: bool = True,
    n_sites: int = N_SITES,
) -> list[tuple[str, str, str]]:
    """``size`` distinct ``(filter_text, subscriber, dialect)`` entries.

    With ``broad`` the first entries are :data:`BROAD_FILTERS` (as many as
    fit in ``size``); the rest belong to tenants named ``{prefix}-000000``,
    ``{prefix}-000001``, ... each holding 1-7 distinct filters about its own
    site, drawn uniformly from the ``n_sites`` world. Each filter's shape is
    drawn with the :data:`SHAPES` shares; when the tenant already holds the
    filter drawn (it can hold only one ``beacon/{r}/{c}/{site}/>``), that
    filter moves to another uniformly drawn site instead of changing shape, so
    the shares hold (a tenant then serves a few sites). Deterministic for
    ``(size, seed, prefix, broad, n_sites)``.
    """
    if size < 0:
        raise ValueError("size must be >= 0")
    rng = random.Random(f"subscriptions:{seed}:{prefix}")
    out: list[tuple[str, str, str]] = list(BROAD_FILTERS[:size]) if broad else []
    low, high = FILTERS_PER_SUBSCRIBER
    tenant = 0
    while len(out) < size:
        subscriber = f"{prefix}-{tenant:06d}"
        tenant += 1
        site = rng.randrange(n_sites)
        want = min(rng.randint(low, high), size - len(out))
        held: set[tuple[str, str]] = set()
        for _ in range(want):
            (kind, _share) = rng.choices(SHAPES, cum_weights=_SHAPE_CUM)[0]
            pair = _tenant_filter(rng, site, kind, n_sites)
            while pair in held:
                pair = _tenant_filter(rng, rng.randrange(n_sites), kind, n_sites)
            held.add(pair)
            out.append((pair[0], subscriber, pair[1]))
    return out


def topics_on_sites(
    entries: list[tuple[str, str, str]], n: int, seed: int = 0, *, n_sites: int = N_SITES
) -> list[str]:
    """``n`` topics on sites that tenants in ``entries`` watch (probes with real answers).

    Used to check the trie against a naive scan on topics that do reach
    tenants, not only the broad filters. Sites outside the ``n_sites`` world
    are ignored, so pass the ``n_sites`` that ``entries`` were built with.
    """
    index = {site_id: i for i, (site_id, _, _) in enumerate(world(n_sites)[0])}
    names = sorted(
        {parts[3] for parts in (t.split("/") for t, _, _ in entries) if len(parts) > 3}
        & index.keys()
    )
    if not names:
        return []
    rng = random.Random(f"probes:{seed}")
    out = []
    for _ in range(n):
        site = index[rng.choice(names)]
        section = rng.choices(SECTIONS, cum_weights=_SECTION_CUM)[0]
        event = rng.choices(EVENTS, cum_weights=_EVENT_CUM)[0]
        out.append(f"{site_path(site, n_sites=n_sites)}/{section}/{event}")
    return out
