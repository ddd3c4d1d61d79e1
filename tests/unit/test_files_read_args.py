"""files/read argument validation, schema and result shape (docs/REFERENCE.md §2.4, §2.5, §3; issue 4)."""

from __future__ import annotations

from typing import Any

import pytest

from mcpd.core.tools import files_read
from mcpd.helper.wire.errors import INVALID_ARGUMENT, ToolError


def invalid(args: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        files_read.parse_args(args)
    assert info.value.code == INVALID_ARGUMENT
    return info.value


def test_parse_args_normalises_every_key() -> None:
    assert files_read.parse_args({"path": "/etc/hosts"}) == {
        "path": "/etc/hosts",
        "start_line": None,
        "end_line": None,
        "offset": None,
        "limit": None,
        "privileged": False,
        "encoding": "utf-8",
        "decompress": True,
        "include_metadata": False,
    }


def test_parse_args_keeps_given_values() -> None:
    args = {
        "path": "/x",
        "start_line": 3,
        "end_line": 9,
        "offset": 0,
        "limit": 1,
        "privileged": True,
        "encoding": "cp1252",
        "decompress": False,
        "include_metadata": True,
    }
    assert files_read.parse_args(args) == args


@pytest.mark.parametrize("key", ["start_line", "end_line"])
def test_base64_reads_bytes_not_lines(key: str) -> None:
    error = invalid({"path": "/x", "encoding": "base64", key: 2})
    assert error.details["argument"] == key and "offset and limit" in error.message


@pytest.mark.parametrize("value", [0, 1, "true", "no", []])
def test_decompress_is_a_boolean(value: Any) -> None:
    assert invalid({"path": "/x", "decompress": value}).details["argument"] == "decompress"


@pytest.mark.parametrize("args", [None, [], "path", 3])
def test_invalid_argument_not_an_object(args: Any) -> None:
    invalid(args)


def test_invalid_argument_missing_path() -> None:
    assert invalid({}).details["argument"] == "path"


@pytest.mark.parametrize("path", ["etc/hosts", "", "./x", "~/x"])
def test_invalid_argument_relative_path(path: str) -> None:
    assert "absolute" in invalid({"path": path}).message


def test_invalid_argument_nul_byte() -> None:
    assert "NUL" in invalid({"path": "/etc/hosts\0.txt"}).message


def test_invalid_argument_path_not_a_string() -> None:
    invalid({"path": ["/etc/hosts"]})


def test_invalid_argument_path_too_long() -> None:
    invalid({"path": "/" + "a" * 5000})


@pytest.mark.parametrize("name", ["start_line", "end_line", "offset", "limit"])
@pytest.mark.parametrize("value", [True, False, 1.0, "3", [1], {"n": 1}])
def test_invalid_argument_wrong_type(name: str, value: Any) -> None:
    """``True`` is not an integer (bool is a subclass of int in Python, not in JSON Schema)."""
    assert invalid({"path": "/x", name: value}).details["argument"] == name


@pytest.mark.parametrize("name", ["start_line", "end_line"])
@pytest.mark.parametrize("value", [0, -1])
def test_invalid_argument_line_number_below_one(name: str, value: int) -> None:
    invalid({"path": "/x", name: value})


def test_invalid_argument_negative_offset() -> None:
    invalid({"path": "/x", "offset": -1})
    assert files_read.parse_args({"path": "/x", "offset": 0})["offset"] == 0


@pytest.mark.parametrize("value", [0, -5])
def test_invalid_argument_limit_below_one(value: int) -> None:
    invalid({"path": "/x", "limit": value})


@pytest.mark.parametrize("name", ["privileged", "include_metadata"])
@pytest.mark.parametrize("value", [1, 0, "true", "yes"])
def test_invalid_argument_boolean_wrong_type(name: str, value: Any) -> None:
    invalid({"path": "/x", name: value})


def test_invalid_argument_unknown_key() -> None:
    assert invalid({"path": "/x", "lines": 3}).details["argument"] == "lines"


@pytest.mark.parametrize("encoding", ["utf-32", "ebcdic", "", 8, "UTF-8 "])
def test_invalid_argument_unknown_encoding(encoding: Any) -> None:
    invalid({"path": "/x", "encoding": encoding})


@pytest.mark.parametrize("encoding", ["utf-8", "ascii", "latin-1", "cp1252", "utf-16", "auto"])
def test_encoding_argument_accepted_values(encoding: str) -> None:
    assert files_read.parse_args({"path": "/x", "encoding": encoding})["encoding"] == encoding


def test_input_schema_matches_parse_args() -> None:
    schema = files_read.INPUT_SCHEMA
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["path"]
    assert set(schema["properties"]) == set(files_read.parse_args({"path": "/x"}))
    assert set(schema["properties"]["encoding"]["enum"]) == {"utf-8", "ascii", "latin-1", "cp1252", "utf-16", "auto", "base64"}
    for name in ("start_line", "end_line", "offset", "limit"):
        assert schema["properties"][name]["type"] == "integer"


def test_description_is_as_precise_as_the_table() -> None:
    for needle in ("10240", "RANGE_OUT_OF_BOUNDS", "byte-exact", "end_line ignored", "clamped", "WARNING", "BINARY_FILE"):
        assert needle in files_read.DESCRIPTION
    assert files_read.NAME == "files/read"


def test_format_result_raw_text_no_line_numbers() -> None:
    reply = files_read.format_result({"text": "a\r\nb"})
    assert reply == {"content": [{"type": "text", "text": "a\r\nb"}]}


def test_format_result_metadata_as_structured_content() -> None:
    meta = {"path": "/x", "size": 3}
    reply = files_read.format_result({"text": "abc", "metadata": meta})
    assert reply["structuredContent"] == meta
    assert reply["content"] == [{"type": "text", "text": "abc"}]
