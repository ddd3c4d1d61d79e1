"""docs/REFERENCE.md §2.5: one validator set, so every tool refuses the same bad arguments alike."""

from __future__ import annotations

from typing import Any

import pytest

from mcpd.common.validate import check_bool, check_choice, check_int, check_object, check_path
from mcpd.core.tools import TOOLS, files_find, files_list, files_read
from mcpd.helper.wire.errors import INVALID_ARGUMENT, ToolError

PATH_KEY = {"files/read": "path", "files/list": "path", "files/filetype": "path", "files/find": "root", "files/grep": "path"}
REQUIRED = {"files/grep": {"pattern": "x"}}  # other arguments a tool needs beside its path


def refused(fn: Any, *args: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        fn(*args)
    assert info.value.code == INVALID_ARGUMENT
    return info.value


def test_every_tool_has_a_path_key() -> None:
    assert set(PATH_KEY) == set(TOOLS)


@pytest.mark.parametrize(
    ("tool", "key"),
    [(files_read, "start_line"), (files_read, "end_line"), (files_read, "offset"), (files_read, "limit"),
     (files_list, "limit"), (files_find, "max_depth"), (files_find, "max_results")],
)
@pytest.mark.parametrize("value", [3.0, 1.5, True, "3", float("inf")])
def test_a_non_integer_is_refused_by_every_tool_alike(tool: Any, key: str, value: Any) -> None:
    path_key = PATH_KEY[tool.NAME]
    err = refused(tool.parse_args, {path_key: "/x", key: value})
    assert err.details["argument"] == key and err.message == f"{key} must be an integer"


def test_integers_are_accepted_where_floats_are_not() -> None:
    assert files_read.parse_args({"path": "/x", "start_line": 3})["start_line"] == 3
    assert files_find.parse_args({"root": "/x", "max_depth": 3})["max_depth"] == 3
    assert files_list.parse_args({"path": "/x", "limit": 3})["limit"] == 3


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize(
    "path",
    ["/tmp/\ud800", "/tmp/\udcff.log", "relative", "", "/a\0b", "/" + "a" * 256, "/x/" + "b" * 4094],
)
def test_every_tool_refuses_the_same_bad_paths(tool: str, path: str) -> None:
    err = refused(TOOLS[tool].parse_args, {**REQUIRED.get(tool, {}), PATH_KEY[tool]: path})
    assert err.details["argument"] == PATH_KEY[tool]


def test_path_rules_and_their_messages() -> None:
    assert "UTF-8" in refused(check_path, {"p": "/x/\udc80"}, "p").message
    assert "absolute" in refused(check_path, {"p": ""}, "p").message
    assert "NUL" in refused(check_path, {"p": "/\0"}, "p").message
    assert "component" in refused(check_path, {"p": "/" + "é" * 128}, "p").message  # 256 bytes
    assert "4096" in refused(check_path, {"p": "/a" * 2049}, "p").message
    assert "missing" in refused(check_path, {}, "p").message
    assert "string" in refused(check_path, {"p": 3}, "p").message


def test_path_limits_are_inclusive() -> None:
    assert check_path({"p": "/" + "a" * 255}, "p") == "/" + "a" * 255
    long = "/" + "/".join(["a" * 200] * 20)
    long = long[:4096]
    assert check_path({"p": long}, "p") == long
    assert check_path({"p": "/x/é"}, "p") == "/x/é"


def test_check_int_bounds_and_huge_values() -> None:
    huge = 2**64 + 1
    assert check_int({"o": huge}, "o", None, 0, None) == huge
    assert files_read.parse_args({"path": "/x", "offset": 10**40})["offset"] == 10**40
    assert check_int({}, "o", 7, 0, None) == 7 and check_int({"o": None}, "o", 7, 0, None) == 7
    assert check_int({"o": 10}, "o", None, 1, 10) == 10
    assert "between 1 and 10" in refused(check_int, {"o": 11}, "o", None, 1, 10).message
    assert "at least 0" in refused(check_int, {"o": -1}, "o", None, 0, None).message
    assert "at least 1" in refused(files_read.parse_args, {"path": "/x", "start_line": 0}).message


def test_check_object_and_bool_and_choice() -> None:
    assert check_object(None, {"a"}) == {}
    assert refused(check_object, {"b": 1}, {"a"}).details["argument"] == "b"
    refused(check_object, [1], {"a"})
    assert check_bool({}, "b") is False and check_bool({"b": True}, "b") is True
    for bad in (1, 0, "true"):
        refused(check_bool, {"b": bad}, "b")
    assert check_choice({}, "c", {"x"}, "x") == "x"
    refused(check_choice, {"c": "y"}, "c", {"x"}, None)
    refused(check_choice, {"c": 1}, "c", {"x"}, None)


def test_check_number_takes_integers_of_any_size_and_refuses_what_is_out_of_range() -> None:
    from mcpd.common.validate import check_number

    assert check_number({}, "t", 10, 0, 60) == 10.0 and isinstance(check_number({}, "t", 10, 0, 60), float)
    assert check_number({"t": 60}, "t", 10, 0, 60) == 60.0 and check_number({"t": 0.5}, "t", 10, 0, 60) == 0.5
    for bad in (0, -1, 60.5, 2**64, 10**400, float("nan"), float("inf"), True, "5"):
        assert refused(check_number, {"t": bad}, "t", 10, 0, 60).details["argument"] == "t"
