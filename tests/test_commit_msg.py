"""The commit-msg rule: a subject of at most 72 characters on one line, then a blank line."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.tool_module import load_tool


def tool() -> ModuleType:
    return load_tool("commit_msg")


def test_a_short_subject_with_a_body_passes():
    assert tool().problems("Add the static decoder\n\nFigures here.\n# a comment\n") == []


def test_a_subject_of_73_characters_is_refused_with_its_length():
    (found,) = tool().problems("x" * 73 + "\n")
    assert "73 characters" in found


def test_exactly_72_passes_and_git_comments_do_not_count():
    assert tool().problems("# Please enter the commit message\n" + "y" * 72) == []


def test_an_empty_subject_and_a_body_without_a_blank_line_are_refused():
    m = tool()
    assert m.problems("# only comments\n") == ["the subject is empty"]
    assert len(m.problems("Subject\nbody at once\n")) == 1


def test_the_hook_refuses_a_long_message_file(tmp_path: Path):
    msg = tmp_path / "MSG"
    msg.write_text("z" * 80 + "\n")
    assert tool().main([str(msg)]) == 1
    msg.write_text("Fix it\n")
    assert tool().main([str(msg)]) == 0
