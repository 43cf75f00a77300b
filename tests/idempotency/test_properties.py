"""Property-based tests (hypothesis): arbitrary headers and bodies never make a 5xx,
and never change a stored answer.

The traffic is generated: ``Idempotency-Key`` values of any latin-1 text
(what a WSGI server hands Django), repeated headers as gunicorn joins them,
lists, quotes, escapes and whitespace; JSON bodies of any shape, including
nesting far past the limits, lone surrogates, numbers too large for any
integer type, duplicate keys, and bytes that are not JSON at all. After every
example, the request stored first is replayed: its status and bytes must be
exactly the first answer's.

Bounded by the ``dio`` settings profile (250 examples per test, about 10 s
each on a 2-core machine); ``HYPOTHESIS_PROFILE=dio-long`` runs 5,000.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency.core import InvalidKey, key_pattern, parse_key
from idempotency.fingerprints import canonical_json

settings.register_profile(
    "dio",
    max_examples=250,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI does not flake on a new find
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "dio-long",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "dio"))

# --- header values ----------------------------------------------------------------------

latin1 = st.characters(min_codepoint=0, max_codepoint=255)
tokens = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


header_values = st.one_of(
    st.text(latin1, max_size=300),  # anything a WSGI server can hand over
    tokens,
    tokens.map(quoted),
    st.lists(st.one_of(tokens, tokens.map(quoted)), min_size=2, max_size=3).flatmap(
        lambda parts: st.sampled_from([",", ", ", " ,", ",\t"]).map(lambda sep: sep.join(parts))
    ),  # a repeated header (gunicorn joins with ","), or a list
    st.tuples(st.sampled_from(["", " ", "\t", "  "]), tokens, st.sampled_from(["", " ", "\t"]))
    .map("".join),  # whitespace around a key
    st.text(st.sampled_from('"\\ ,;=abc\t'), max_size=12),  # quotes, escapes, separators
    st.just("x" * 256),
    st.just(quoted("x" * 255)),
)

# --- bodies -----------------------------------------------------------------------------

lone_surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
json_text = st.text(st.one_of(st.characters(), lone_surrogate), max_size=20)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**18, max_value=10**300),
    st.floats(allow_nan=False, allow_infinity=False),
    json_text,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(json_text, inner, max_size=4),
    ),
    max_leaves=20,
)


def encode(value) -> str:
    # ensure_ascii writes a lone surrogate as its \\udxxx escape, as a client would.
    return json.dumps(value, ensure_ascii=True)


def deep(depth: int, kind: str) -> str:
    opening, closing = ("[", "]") if kind == "list" else ('{"a":', "}")
    return opening * depth + "1" + closing * depth


order_like = st.fixed_dictionaries(
    {"sku": json_text, "quantity": st.one_of(st.integers(), scalars)},
    optional={"note": json_values},
).map(encode)

bodies = st.one_of(
    json_values.map(encode),
    order_like,
    st.tuples(st.integers(1, 20_000), st.sampled_from(["list", "dict"])).map(
        lambda args: deep(*args)
    ),
    st.tuples(json_text, json_values, json_values).map(  # duplicate keys
        lambda kv: f"{{{encode(kv[0])}:{encode(kv[1])},{encode(kv[0])}:{encode(kv[2])}}}"
    ),
    st.integers(300, 6000).map(lambda n: '{"quantity": ' + "9" * n + "}"),  # huge numbers
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),  # not JSON at all
)

# --- the stored answer, replayed after every example --------------------------------------

ANCHOR_KEY = "anchor-0001"
ANCHOR_BODY = json.dumps({"sku": "tea", "quantity": 2})


def send(client, path: str, body: str, key: str | None, content_type="application/json"):
    headers = {"X-User": "alice"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.generic(
        "POST", path, body.encode("utf-8", "surrogatepass"), content_type=content_type,
        headers=headers,
    )


class Anchor:
    """The first stored answer of a test, and the check that it never changes."""

    def __init__(self, client, path: str) -> None:
        self.client, self.path = client, path
        self.first = None

    def ensure(self) -> None:
        if self.first is None:
            response = send(self.client, self.path, ANCHOR_BODY, ANCHOR_KEY)
            assert response.status_code == 201, response.content
            self.first = response

    def replays_unchanged(self) -> None:
        again = send(self.client, self.path, ANCHOR_BODY, ANCHOR_KEY)
        assert again.status_code == self.first.status_code
        assert again.content == self.first.content
        assert again["Idempotent-Replayed"] == "true"


@pytest.fixture
def resolver(settings):
    def tenant_of(request):  # the DRF user's tenant; a plain Django request is alice's
        tenant = getattr(request.user, "tenant_id", None)
        return tenant if tenant is not None else 1

    settings.TENANCY = {**settings.TENANCY, "TENANT_RESOLVER": tenant_of}


@pytest.mark.parametrize("path", ["/fuzz-orders/", "/fuzz-django-orders/"])
def test_any_key_header_never_makes_a_5xx_nor_changes_a_stored_answer(client, resolver, path):
    anchor = Anchor(client, path)

    @PROFILE
    @given(header=header_values, same_body=st.booleans())
    def run(header, same_body):
        anchor.ensure()
        response = send(client, path, ANCHOR_BODY if same_body else '{"sku": "x"}', header)
        assert response.status_code < 500, (header, response.content[:300])
        if response.status_code >= 400:
            assert response["Content-Type"] == "application/problem+json"
        anchor.replays_unchanged()

    run()


@pytest.mark.parametrize("path", ["/fuzz-orders/", "/fuzz-django-orders/"])
def test_any_body_never_makes_a_5xx_nor_changes_a_stored_answer(client, resolver, path):
    anchor = Anchor(client, path)
    keys = iter(range(10**9))

    @PROFILE
    @given(body=bodies, reuse_anchor_key=st.booleans(),
           content_type=st.sampled_from(["application/json", "application/json",
                                         "application/x-www-form-urlencoded", "text/plain"]))
    def run(body, reuse_anchor_key, content_type):
        anchor.ensure()
        key = ANCHOR_KEY if reuse_anchor_key else f"body-{next(keys)}"
        response = send(client, path, body, key, content_type)
        assert response.status_code < 500, (body[:200], response.content[:300])
        if reuse_anchor_key and body != ANCHOR_BODY:
            assert response.status_code in (400, 413, 415, 422), response.content[:300]
        anchor.replays_unchanged()

    run()


# --- the pieces: the key parser and its schema, the canonical form --------------------------


@PROFILE
@given(header_values)
def test_the_schemas_key_pattern_accepts_exactly_what_the_parser_accepts(value):
    pattern = re.compile(key_pattern())
    try:
        parse_key(value)
        accepted = True
    except InvalidKey:
        accepted = False
    assert accepted == bool(pattern.match(value.strip(" \t"))), value


@PROFILE
@given(json_values)
def test_canonical_json_is_json_dumps_where_json_dumps_works(value):
    try:
        expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        expected_bytes = expected.encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        expected_bytes = None  # lone surrogates, or an int past Python's str() limit
    actual = canonical_json(value)
    if expected_bytes is not None:
        assert actual == expected_bytes


@pytest.mark.parametrize("depth", [10, 1_000, 100_000])
def test_canonical_json_walks_any_depth(depth):
    value: object = "x"
    for _ in range(depth):
        value = {"a": [value]}
    assert canonical_json(value).startswith(b'{"a":[{"a":[')


def test_canonical_json_of_integers_past_str_limit_and_lone_surrogates():
    assert canonical_json(10**5000).startswith(b"0x")
    assert canonical_json(-(10**5000)).startswith(b"-0x")
    assert canonical_json({"\ud800": "\udfff"}) == b'{"\xed\xa0\x80":"\xed\xbf\xbf"}'
    assert canonical_json("\ud800") != canonical_json("\ud801")
