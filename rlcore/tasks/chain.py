"""The `chain` task: sums of 2 to N operands, answered by working each step.

A prompt is `12+35+8=`; the correct response is the worked chain `12+35=47;47+8=55`, one
step per operand after the first, and it is checked exactly (the whole response must equal
it). So a response is as long as its problem needs: a two-operand sum of small numbers is 5
characters, five operands of two digits over 40. A rollout of such answers crosses several
policy-version looks (`rollout.chunk_tokens`), which is where interrupts, partial rollouts
and length bias live.
"""

from __future__ import annotations

import random
import re

STEP_SEPARATOR = ";"
_STEP = re.compile(r"(\d+)\+(\d+)=(\d+)")


def chain_prompt(operands: list[int]) -> str:
    """'12+35+8='."""
    return "+".join(map(str, operands)) + "="


def worked_chain(operands: list[int]) -> str:
    """The correct response: '12+35=47;47+8=55' (each step adds the next operand)."""
    steps, total = [], operands[0]
    for x in operands[1:]:
        steps.append(f"{total}+{x}={total + x}")
        total += x
    return STEP_SEPARATOR.join(steps)


def chain_problems(rng: random.Random, count: int, min_terms: int, max_terms: int,
                   max_operand: int) -> list[list[int]]:
    """`count` distinct operand lists, the number of terms uniform in [min_terms, max_terms].

    Raises ValueError when the setting has fewer than `count` distinct problems."""
    distinct = sum((max_operand + 1) ** n for n in range(min_terms, max_terms + 1))
    if count > distinct:
        raise ValueError(f"{count} problems asked of a setting with {distinct} distinct ones")
    seen: set[tuple[int, ...]] = set()
    problems: list[list[int]] = []
    while len(problems) < count:
        ops = tuple(rng.randint(0, max_operand) for _ in range(rng.randint(min_terms, max_terms)))
        if ops not in seen:
            seen.add(ops)
            problems.append(list(ops))
    return problems


def is_chain(text: str) -> bool:
    """True if `text` is a worked chain of one or more steps (correct or not)."""
    return all(_STEP.fullmatch(s) for s in text.split(STEP_SEPARATOR))


def slip(worked: str, rng: random.Random) -> str:
    """The same chain with one arithmetic slip: a step's result off by 1 to 10, and every
    later step carried on consistently from the wrong value (a plausible wrong answer)."""
    steps = [_STEP.fullmatch(s) for s in worked.split(STEP_SEPARATOR)]
    if not all(steps):
        raise ValueError(f"not a worked chain: {worked!r}")
    first = int(steps[0].group(1))  # type: ignore[union-attr]
    addends = [int(m.group(2)) for m in steps]  # type: ignore[union-attr]
    where = rng.randrange(len(addends))
    total, out = first, []
    for i, x in enumerate(addends):
        result = total + x
        if i == where:
            result = max(0, result + rng.choice([d for d in range(-10, 11) if d]))
            if result == total + x:  # clamped at 0 back onto the right value
                result += 1
        out.append(f"{total}+{x}={result}")
        total = result
    return STEP_SEPARATOR.join(out)
