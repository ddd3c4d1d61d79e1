"""JSON nesting (SPEC §2.3): deeper than 64 levels is refused like unparsable JSON, by the one
parser every mcpd process uses (:func:`mcpd.common.frames.loads`), and never raises anything but
:class:`~mcpd.common.frames.FrameError`, however deep."""

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
