"""Label texts: what a label says about itself, read and checked.

A label-texts file is JSONL, one `{"name": ..., "text": ...}` per line (blank lines skipped). A model
trained with one (`ovex train --label-texts FILE`) stores its label tower and the texts beside the usual
files (`trainer.label_tower`), so a label that has never had a training row can be given a head row from
its text (`trainer.label_tower.label_rows`), exactly as training materialized the rows of such labels.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainer.data import label_name_problem, undecodable_line
from trainer.errors import DataFormatError

MAX_LABEL_NAME_CHARS = 1000  # as a label name anywhere else (trainer.data.MAX_LABEL_NAME)
MAX_LABEL_TEXT_CHARS = 10_000  # a description, not a document: longer texts are refused, not cut
_KEYS = {"name", "text"}



def _surrogate_at(text: str) -> int | None:
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            return i
    return None


def text_problem(text: object) -> str | None:
    """What is wrong with a label's text, or None."""
    if not isinstance(text, str):
        return f"'text' must be a string, got {type(text).__name__}"
    if not text.strip():
        return "'text' is empty"
    if len(text) > MAX_LABEL_TEXT_CHARS:
        return f"'text' is {len(text):,} characters long; at most {MAX_LABEL_TEXT_CHARS:,} are allowed"
    at = _surrogate_at(text)
    if at is not None:
        return (f"'text' holds a lone surrogate {text[at]!r} at character {at + 1}: a \\uXXXX escape that is "
                "half of a UTF-16 pair is not text; escape the whole pair or write the character itself")
    return None


def name_problem(name: object) -> str | None:
    """What is wrong with a label's name, or None."""
    if not isinstance(name, str):
        return f"'name' must be a string, got {type(name).__name__}"
    if not name:
        return "'name' is empty"
    return label_name_problem(name)


def check_label_text(name: object, text: object) -> str | None:
    """What is wrong with one (name, text) pair, said as what to fix; None when both are fine."""
    return name_problem(name) or text_problem(text)


def _parse_line(line: str, path: str, lineno: int) -> tuple[str, str]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataFormatError(path, lineno, f"invalid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise DataFormatError(path, lineno, "JSON nested too deeply") from None
    except ValueError:
        raise DataFormatError(path, lineno, "a JSON number with more than "
                              f"{sys.get_int_max_str_digits():,} digits") from None
    if not isinstance(obj, dict):
        raise DataFormatError(path, lineno, f"expected a JSON object with 'name' and 'text', got "
                              f"{type(obj).__name__}")
    extra = set(obj) - _KEYS
    if extra:
        shown = sorted(str(k)[:40] for k in extra)[:5]
        raise DataFormatError(path, lineno, f"unknown key(s) {shown}; allowed: name, text")
    for key in ("name", "text"):
        if key not in obj:
            raise DataFormatError(path, lineno, f"missing key {key!r}")
    problem = check_label_text(obj["name"], obj["text"])
    if problem:
        raise DataFormatError(path, lineno, problem)
    return obj["name"], obj["text"]


def read_label_texts(path: Path | str) -> list[tuple[str, str]]:
    """(name, text) per line of a label-texts file, in file order; DataFormatError (file, line, what to
    fix) for anything else, a duplicate name included."""
    spath = str(path)
    try:
        fh = open(spath, encoding="utf-8-sig")  # noqa: SIM115 - closed below; streaming read
    except OSError as e:
        raise DataFormatError(spath, 0, f"cannot open: {e.strerror}") from None
    out: list[tuple[str, str]] = []
    first_line: dict[str, int] = {}
    lineno = 0
    try:
        with fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                name, text = _parse_line(line, spath, lineno)
                if name in first_line:
                    raise DataFormatError(spath, lineno, f"duplicate label name {name[:40]!r} (first on line "
                                          f"{first_line[name]})")
                first_line[name] = lineno
                out.append((name, text))
    except UnicodeDecodeError as e:
        raise DataFormatError(spath, undecodable_line(spath, lineno + 1), f"not UTF-8 text: {e.reason}"
                              ) from None
    if not out:
        raise DataFormatError(spath, max(lineno, 1), "empty file: no label texts")
    return out
