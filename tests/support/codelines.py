"""Count the code lines of a Python source: the measure of the root helper's budget.

A code line is a line that holds a Python token other than a comment, a line break or indentation,
where docstrings (module, class and function) do not count. A string spread over several lines
that is not a docstring counts on every line it covers.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

_NOT_CODE = {
    tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
    tokenize.ENCODING, tokenize.ENDMARKER,
}

Span = tuple[tuple[int, int], tuple[int, int]]  # ((row, col), (end_row, end_col)) as tokenize gives


def docstring_spans(tree: ast.Module) -> list[Span]:
    """Where each docstring of the module, its classes and functions lies."""
    spans: list[Span] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str) and first.end_lineno is not None
                and first.end_col_offset is not None):
            spans.append(((first.lineno, first.col_offset), (first.end_lineno, first.end_col_offset)))
    return spans


def code_lines(source: str) -> int:
    """The number of code lines in ``source`` (see the module docstring)."""
    spans = docstring_spans(ast.parse(source))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in _NOT_CODE:
            continue
        if any(start <= tok.start and tok.end <= end for start, end in spans):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


def folder_code_lines(folder: Path, repo: Path) -> dict[str, int]:
    """{path relative to ``repo``: code lines} of every module under ``folder``, sorted by path."""
    return {str(p.relative_to(repo)): code_lines(p.read_text(encoding="utf-8")) for p in sorted(folder.rglob("*.py"))}
