"""Spark and the plain bridge derive the same topic (or the same reason) for the same record.

One DataFrame holds the whole corpus, so the comparison costs one Spark job.
"""

from __future__ import annotations

import json

from bridges.mapping import DecodeError, MappingError, TopicTemplate, decode_json
from bridges.spark.compiler import compile_topic

TEMPLATE = "beacon/{region}/{country}/{site|unknown}/{page.section}/{event}"
BASE = {"region": "eu", "country": "de", "site": "s1", "page": {"section": "home"},
        "event": "view"}  # fmt: skip

CORPUS: list[bytes] = [
    json.dumps(BASE).encode(),
    json.dumps({**BASE, "site": None}).encode(),  # default
    json.dumps({**BASE, "site": ""}).encode(),  # empty counts as missing: default
    json.dumps({**BASE, "region": None}).encode(),  # missing_field
    json.dumps({k: v for k, v in BASE.items() if k != "event"}).encode(),  # missing_field
    json.dumps({**BASE, "event": {"a": 1}}).encode(),  # not_scalar
    json.dumps({**BASE, "event": [1, 2]}).encode(),  # not_scalar
    json.dumps({**BASE, "site": "a/b>*+#%"}).encode(),  # escaped
    json.dumps({**BASE, "region": "$SYS"}).encode(),  # leading $
    json.dumps({**BASE, "site": "x\u0001y\u007fz"}).encode(),  # controls
    json.dumps({**BASE, "site": "zürich-東京"}).encode(),  # non-ASCII passes
    json.dumps({**BASE, "site": 42}).encode(),  # int
    json.dumps({**BASE, "site": -7}).encode(),
    json.dumps({**BASE, "site": True}).encode(),  # bool
    json.dumps({**BASE, "site": 1.5}).encode(),  # float
    json.dumps({**BASE, "site": "s" * 300}).encode(),  # topic_too_long
    json.dumps({**BASE, "page": "flat"}).encode(),  # nested path through a string
    b"{not json",  # decode
    b"[1, 2]",  # decode: not an object
    b"\xff\xfe",  # decode: not UTF-8
    b"",  # decode
]


def plain(template: TopicTemplate, value: bytes) -> tuple[str | None, str | None]:
    try:
        return template.topic(decode_json(value)), None
    except DecodeError:
        return None, "decode"
    except MappingError as exc:
        return None, exc.reason


def test_spark_and_the_plain_bridge_map_every_record_alike(spark) -> None:
    template = TopicTemplate.compile(TEMPLATE)
    compiled = compile_topic(template, value_column="value")
    df = spark.createDataFrame([(i, v) for i, v in enumerate(CORPUS)], "n INT, value BINARY")
    rows = compiled.select(df).orderBy("n").collect()
    got = [(row["topic"], row["reason"]) for row in rows]
    expected = [plain(template, value) for value in CORPUS]
    assert got == expected
    assert got[0] == ("beacon/eu/de/s1/home/view", None)
    assert got[7][0] == "beacon/eu/de/a%2Fb%3E%2A%2B%23%25/home/view"
