"""One number rule on every process (issue 28 item 5): JSON parsed from another mcpd process
(:func:`mcpd.common.wirejson.loads`, orjson) has the integers the standard library's parser
gives, of any size; orjson alone made 2**64 a float, which every integer argument then refused."""

from __future__ import annotations

import json

import orjson
import pytest

from mcpd.common import frames, wirejson
from mcpd.helper.wire.frames import codec

INTEGERS = [0, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1, 2**100, -2**100, 10**400, -10**400,
            10**19, 10**18, 123456789012345678901234567890]


@pytest.mark.parametrize("value", INTEGERS, ids=lambda v: str(v)[:24])
def test_an_integer_of_any_size_comes_back_the_same_int(value: int) -> None:
    for text in (json.dumps(value), json.dumps({"args": {"offset": value}}), json.dumps([1.5, "x" * 30, value])):
        parsed = wirejson.loads(text.encode())
        assert parsed == json.loads(text)
        assert json.dumps(parsed) == text  # exact: no float anywhere


def test_orjson_alone_would_lose_them() -> None:
    """The reason for the rule: orjson parses integers past 64 bits as floats."""
    assert type(orjson.loads(b"18446744073709551616")) is float
    assert type(orjson.loads(b"-9223372036854775809")) is float


def test_numbers_with_a_fraction_or_exponent_are_floats_as_json_loads_has_them() -> None:
    for text in ("1e400", "-1e400", "1.5", "1E2", "-0.0", "0.12345678901234567890123", "1.8446744073709552e+19"):
        assert repr(wirejson.loads(text.encode())) == repr(json.loads(text))


def test_long_digit_runs_in_strings_change_nothing() -> None:
    text = json.dumps({"name": "9" * 40, "size": 12, "sha": "0123456789" * 4})
    assert wirejson.loads(text.encode()) == json.loads(text)
    assert wirejson.maybe_lossy(text.encode()) and not wirejson.maybe_lossy(b'{"size": 184467440737095516}')


def test_frames_decoded_with_the_codec_keep_huge_integers() -> None:
    """As the worker and the policy process decode every frame (frames.use_codec)."""
    body = wirejson.dumps({"id": 1, "op": "files/read", "args": {"path": "/x", "offset": 2**64, "end_line": 10**400}})
    saved = dict(codec)
    frames.use_codec(wirejson.dumps, wirejson.loads)
    try:
        assert frames.decode_body(body)["args"] == {"path": "/x", "offset": 2**64, "end_line": 10**400}
    finally:
        codec.clear()
        codec.update(saved)


def test_depth_is_still_refused_on_the_fallback() -> None:
    deep = "[" * 65 + str(2**64) + "]" * 65
    with pytest.raises(frames.FrameError):
        wirejson.loads(deep.encode())
