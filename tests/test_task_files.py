"""Task files as datasets ship them: the gsm8k and math field presets' answer extraction."""

from __future__ import annotations

import pytest

from rlcore.tasks.fields import FieldError, boxed_answer, gsm8k_answer


class TestGsm8kAnswer:
    @pytest.mark.parametrize(("text", "gold"), [
        ("She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7", "7"),
        ("1,000 + 234 = 1,234\n#### 1,234", "1234"),
        ("#### 1,234,567", "1234567"),
        ("It fell 4 - 11 = -7.\n#### -7", "-7"),
        ("7 / 4 = 1.75\n#### 1.75", "1.75"),
        ("#### 12,000.5", "12000.5"),
        ("####  42  \n", "42"),
        ("#### 1\n#### 2", "2"),  # the last marker is the answer
    ])
    def test_the_tail_number_without_separators(self, text: str, gold: str) -> None:
        assert gsm8k_answer(text) == gold

    @pytest.mark.parametrize(("text", "fragment"), [
        ("The answer is 7.", "no '#### '"),
        ("", "no '#### '"),
        ("reasoning\n#### ", "got ''"),
        ("#### seven", "got 'seven'"),
        ("#### 1,5", "got '1,5'"),  # not a thousands separator: refused, not read as 15
        ("#### 7\nso the answer is seven", "got '7\\nso the answer"),
        ("#### $7", "got '$7'"),
    ])
    def test_malformed_answers_raise_a_clear_error(self, text: str, fragment: str) -> None:
        with pytest.raises(FieldError, match="####") as info:
            gsm8k_answer(text)
        assert fragment in str(info.value)


class TestBoxedAnswer:
    @pytest.mark.parametrize(("text", "gold"), [
        (r"So $x = \boxed{5}$.", "5"),
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        (r"$\boxed{\frac{\sqrt{3}}{2}}$", r"\frac{\sqrt{3}}{2}"),
        (r"first \boxed{1}, then \boxed{-2}", "-2"),  # the last one
        (r"$\fbox{\sqrt{2}}$", r"\sqrt{2}"),
        (r"\boxed{1} or \fbox{3}", "3"),
        (r"\boxed { 0.25 }", "0.25"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not group
        (r"\boxed{1{,}048}", "1{,}048"),
        (r"\boxed{\text{(B)}}", r"\text{(B)}"),
    ])
    def test_the_last_boxed_content(self, text: str, gold: str) -> None:
        assert boxed_answer(text) == gold

    @pytest.mark.parametrize(("text", "fragment"), [
        ("The answer is 5.", r"no \boxed{...}"),
        (r"\boxedx{5}", r"no \boxed{...}"),
        (r"$\boxed{\frac{1}{2}$", "unbalanced braces"),
        (r"\boxed{1} and \boxed{2", "unbalanced braces"),
        (r"\boxed{\}", "unbalanced braces"),
        (r"\boxed{ }", "empty"),
        (r"\boxed 5", "not followed by '{'"),
        ("ends with \\boxed", "not followed by '{'"),
    ])
    def test_malformed_solutions_raise_a_clear_error(self, text: str, fragment: str) -> None:
        with pytest.raises(FieldError) as info:
            boxed_answer(text)
        assert fragment in str(info.value)
