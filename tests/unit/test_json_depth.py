"""JSON nesting (docs/REFERENCE.md §2.3): deeper than 64 levels is refused like unparsable JSON, by the one
parser every mcpd process uses (:func:`mcpd.common.frames.loads`), and never raises anything but
:class:`~mcpd.helper.wire.frames.FrameError`, however deep."""

from __future__ import annotations

import pytest

from mcpd.common import frames


def nested(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


@pytest.mark.parametrize("depth", [1, 2, 63, 64])
def test_up_to_64_levels_parse(depth: int) -> None:
    assert frames.loads(nested(depth)) is not None
    assert frames.loads('{"a": ' + nested(depth - 1) + "}") is not None if depth > 1 else True


@pytest.mark.parametrize("depth", [65, 100, 1_000, 100_000])
def test_deeper_is_refused_as_not_json(depth: int) -> None:
    with pytest.raises(frames.FrameError):
        frames.loads(nested(depth))
    with pytest.raises(frames.FrameError):
        frames.decode_body(('{"x": ' + nested(depth - 1) + "}").encode())


def test_objects_count_like_arrays() -> None:
    deep = '{"a": ' * 65 + "1" + "}" * 65
    with pytest.raises(frames.FrameError):
        frames.loads(deep)
    ok = '{"a": ' * 64 + "1" + "}" * 64
    assert frames.loads(ok)["a"]["a"] is not None


def test_wide_is_not_deep() -> None:
    wide = "[" + ",".join(["[1]"] * 50_000) + "]"
    assert len(frames.loads(wide)) == 50_000


@pytest.mark.parametrize("codec", ["std", "strict", "wire"])
def test_every_parser_counts_depth_the_same_with_or_without_brackets_in_strings(codec: str) -> None:
    """The bracket count that spares the walk for small texts never lets a deep one through, nor
    refuses a shallow one whose strings hold brackets."""
    from mcpd.common import wirejson

    def parse(text: str) -> object:
        data = text.encode()
        if codec == "std":
            return frames.loads(data)
        if codec == "strict":
            return frames.loads(data, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
        return wirejson.loads(data)

    with pytest.raises(frames.FrameError):
        parse(nested(65))
    with pytest.raises(frames.FrameError):
        parse('{"s": "' + "]" * 100 + '", "x": ' + nested(64) + "}")
    assert parse('{"s": "' + "[{" * 100 + '", "x": ' + nested(63) + "}") is not None


def test_a_strict_parse_refuses_non_finite_numbers_every_time_and_decodes_bytes_as_json_loads_does() -> None:
    def refuse(name: str) -> None:
        raise ValueError(name)

    for _ in range(3):  # one decoder kept per parse_constant: still refusing on every call
        with pytest.raises(frames.FrameError):
            frames.loads(b'{"x": NaN}', parse_constant=refuse)
    assert frames.loads('{"x": [1, "\\ud800"]}'.encode("utf-16"), parse_constant=refuse) == {"x": [1, "\ud800"]}
    assert frames.loads(b"\xef\xbb\xbf{}", parse_constant=refuse) == {}
    with pytest.raises(frames.FrameError):
        frames.loads(b'{"x": "\xff"}', parse_constant=refuse)
