"""Reference solutions for the shipped code tasks (rlcore/tasks/data/code/*.jsonl).

CORRECT[task_id] passes every test of its task; WRONG[task_id] is a plausible mistake
(off-by-one, a missed edge case) that fails at least one test.
"""

CORRECT: dict[str, str] = {
    "code-train-01-clamp": """def clamp(x, lo, hi):
    return max(lo, min(x, hi))
""",
    "code-train-02-count-vowels": """def count_vowels(text):
    return sum(ch in "aeiouAEIOU" for ch in text)
""",
    "code-train-03-rle-encode": """def rle_encode(s):
    from itertools import groupby

    return "".join(f"{ch}{len(list(run))}" for ch, run in groupby(s))
""",
    "code-train-04-digit-sum": """def digit_sum(n):
    return sum(int(d) for d in str(abs(n)))
""",
    "code-train-05-is-balanced": """def is_balanced(s):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in s:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack
""",
    "code-train-06-to-roman": """def to_roman(n):
    table = [
        (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
        (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
    ]
    out = []
    for value, symbol in table:
        count, n = divmod(n, value)
        out.append(symbol * count)
    return "".join(out)
""",
    "code-train-07-caesar-shift": """def caesar_shift(text, k):
    out = []
    for ch in text:
        if "a" <= ch <= "z":
            out.append(chr((ord(ch) - ord("a") + k) % 26 + ord("a")))
        elif "A" <= ch <= "Z":
            out.append(chr((ord(ch) - ord("A") + k) % 26 + ord("A")))
        else:
            out.append(ch)
    return "".join(out)
""",
    "code-train-08-merge-intervals": """def merge_intervals(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
""",
    "code-train-09-transpose": """def transpose(matrix):
    return [list(column) for column in zip(*matrix)]
""",
    "code-train-10-letter-counts": """def letter_counts(text):
    counts = {}
    for ch in text.lower():
        if ch.isalpha():
            counts[ch] = counts.get(ch, 0) + 1
    return counts
""",
    "code-train-11-second-largest": """def second_largest(nums):
    distinct = sorted(set(nums))
    return distinct[-2] if len(distinct) >= 2 else None
""",
    "code-train-12-chunk": """def chunk(items, size):
    return [items[i:i + size] for i in range(0, len(items), size)]
""",
    "code-train-13-flatten": """def flatten(nested):
    out = []
    for item in nested:
        if isinstance(item, list):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
""",
    "code-train-14-phrase-palindrome": """def is_phrase_palindrome(text):
    kept = [ch for ch in text.lower() if ch.isalnum()]
    return kept == kept[::-1]
""",
    "code-train-15-parse-kv": """def parse_kv(text):
    result = {}
    for piece in text.split(";"):
        if piece.strip():
            key, _, value = piece.partition("=")
            result[key.strip()] = value.strip()
    return result
""",
    "code-train-16-gcd-all": """def gcd_all(nums):
    from math import gcd

    result = 0
    for n in nums:
        result = gcd(result, n)
    return result
""",
    "code-train-17-collatz-steps": """def collatz_steps(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps
""",
    "code-train-18-capitalize-words": """def capitalize_words(text):
    return " ".join(word.capitalize() for word in text.split(" "))
""",
    "code-train-19-rotate-right": """def rotate_right(items, k):
    if not items:
        return []
    k %= len(items)
    return items[-k:] + items[:-k]
""",
    "code-train-20-dedupe": """def dedupe(items):
    return list(dict.fromkeys(items))
""",
    "code-train-21-longest-zero-gap": """def longest_zero_gap(n):
    return max(len(gap) for gap in bin(n)[2:].strip("0").split("1"))
""",
    "code-train-22-count-pairs-with-sum": """def count_pairs_with_sum(nums, target):
    count = 0
    for i in range(len(nums)):
        for j in range(i + 1, len(nums)):
            if nums[i] + nums[j] == target:
                count += 1
    return count
""",
    "code-train-23-running-total": """def running_total(nums):
    out = []
    total = 0
    for x in nums:
        total += x
        out.append(total)
    return out
""",
    "code-train-24-most-common-word": """def most_common_word(text):
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return max(counts, key=counts.get)
""",
    "code-train-25-snake-to-camel": """def snake_to_camel(name):
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)
""",
    "code-train-26-diagonal-sum": """def diagonal_sum(matrix):
    n = len(matrix)
    total = sum(matrix[i][i] + matrix[i][n - 1 - i] for i in range(n))
    if n % 2 == 1:
        total -= matrix[n // 2][n // 2]
    return total
""",
    "code-train-27-is-valid-ipv4": """def is_valid_ipv4(s):
    parts = s.split(".")
    if len(parts) != 4:
        return False
    for part in parts:
        if not (part.isascii() and part.isdigit()):
            return False
        if int(part) > 255 or (len(part) > 1 and part[0] == "0"):
            return False
    return True
""",
    "code-train-28-squeeze": """def squeeze(text):
    out = []
    for ch in text:
        if not out or out[-1] != ch:
            out.append(ch)
    return "".join(out)
""",
    "code-train-29-nth-prime": """def nth_prime(n):
    count = 0
    candidate = 1
    while count < n:
        candidate += 1
        if all(candidate % d for d in range(2, int(candidate ** 0.5) + 1)):
            count += 1
    return candidate
""",
    "code-train-30-group-anagrams": """def group_anagrams(words):
    groups = {}
    for word in words:
        groups.setdefault("".join(sorted(word)), []).append(word)
    return list(groups.values())
""",
    "code-train-31-mask-digits": """def mask_digits(card):
    to_mask = sum(ch.isdigit() for ch in card) - 4
    out = []
    for ch in card:
        if ch.isdigit() and to_mask > 0:
            out.append("*")
            to_mask -= 1
        else:
            out.append(ch)
    return "".join(out)
""",
    "code-train-32-is-leap-year": """def is_leap_year(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
""",
    "code-train-33-to-seconds": """def to_seconds(stamp):
    total = 0
    for part in stamp.split(":"):
        total = total * 60 + int(part)
    return total
""",
    "code-train-34-interleave": """def interleave(a, b):
    out = []
    for i in range(max(len(a), len(b))):
        if i < len(a):
            out.append(a[i])
        if i < len(b):
            out.append(b[i])
    return out
""",
    "code-train-35-digital-root": """def digital_root(n):
    while n >= 10:
        n = sum(int(d) for d in str(n))
    return n
""",
    "code-train-36-longest-run": """def longest_run(items):
    best = current = 0
    for i, x in enumerate(items):
        current = current + 1 if i > 0 and x == items[i - 1] else 1
        best = max(best, current)
    return best
""",
    "code-heldout-01-format-duration": """def format_duration(seconds):
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v]
    return " ".join(parts) or "0s"
""",
    "code-heldout-02-median": """def median(nums):
    ordered = sorted(nums)
    mid = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
""",
    "code-heldout-03-rle-decode": """def rle_decode(code):
    out = []
    i = 0
    while i < len(code):
        j = i + 1
        while j < len(code) and code[j].isdigit():
            j += 1
        out.append(code[i] * int(code[i + 1:j]))
        i = j
    return "".join(out)
""",
    "code-heldout-04-pascal-row": """def pascal_row(n):
    row = [1]
    for _ in range(n):
        row = [a + b for a, b in zip([0] + row, row + [0])]
    return row
""",
    "code-heldout-05-binary-search": """def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
""",
    "code-heldout-06-triangle-kind": """def triangle_kind(a, b, c):
    x, y, z = sorted((a, b, c))
    if x + y <= z:
        return "invalid"
    if x == z:
        return "equilateral"
    if x == y or y == z:
        return "isosceles"
    return "scalene"
""",
    "code-heldout-07-hex-to-rgb": """def hex_to_rgb(color):
    digits = color.lstrip("#")
    if len(digits) == 3:
        digits = "".join(d * 2 for d in digits)
    return tuple(int(digits[i:i + 2], 16) for i in (0, 2, 4))
""",
    "code-heldout-08-flatten-dict": """def flatten_dict(d, prefix=""):
    out = {}
    for key, value in d.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(flatten_dict(value, path))
        else:
            out[path] = value
    return out
""",
    "code-heldout-09-stair-ways": """def stair_ways(n):
    a, b = 1, 1
    for _ in range(n):
        a, b = b, a + b
    return a
""",
    "code-heldout-10-luhn-valid": """def luhn_valid(number):
    digits = [int(ch) for ch in number if ch != " "]
    if len(digits) < 2:
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2 == 1:
            d = d * 2 - 9 if d * 2 > 9 else d * 2
        total += d
    return total % 10 == 0
""",
    "code-heldout-11-acronym": """def acronym(phrase):
    return "".join(word[0].upper() for word in phrase.replace("-", " ").split())
""",
    "code-heldout-12-camel-to-snake": """def camel_to_snake(name):
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i > 0:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)
""",
}


WRONG: dict[str, str] = {
    "code-train-01-clamp": """def clamp(x, lo, hi):
    if x < lo:
        return lo
    return x
""",
    "code-train-02-count-vowels": """def count_vowels(text):
    return sum(ch in "aeiou" for ch in text)
""",
    "code-train-03-rle-encode": """def rle_encode(s):
    out = []
    count = 1
    for i in range(1, len(s)):
        if s[i] == s[i - 1]:
            count += 1
        else:
            out.append(s[i - 1] + str(count))
            count = 1
    return "".join(out)
""",
    "code-train-04-digit-sum": """def digit_sum(n):
    return sum(int(d) for d in str(n))
""",
    "code-train-05-is-balanced": """def is_balanced(s):
    return all(s.count(o) == s.count(c) for o, c in ("()", "[]", "{}"))
""",
    "code-train-06-to-roman": """def to_roman(n):
    table = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (9, "IX"),
             (5, "V"), (4, "IV"), (1, "I")]
    out = []
    for value, symbol in table:
        count, n = divmod(n, value)
        out.append(symbol * count)
    return "".join(out)
""",
    "code-train-07-caesar-shift": """def caesar_shift(text, k):
    out = []
    for ch in text:
        if "a" <= ch <= "z":
            out.append(chr((ord(ch) - ord("a") + k) % 26 + ord("a")))
        else:
            out.append(ch)
    return "".join(out)
""",
    "code-train-08-merge-intervals": """def merge_intervals(intervals):
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
""",
    "code-train-09-transpose": """def transpose(matrix):
    n = len(matrix)
    return [[matrix[i][j] for i in range(n)] for j in range(n)]
""",
    "code-train-10-letter-counts": """def letter_counts(text):
    counts = {}
    for ch in text:
        if ch.isalpha():
            counts[ch] = counts.get(ch, 0) + 1
    return counts
""",
    "code-train-11-second-largest": """def second_largest(nums):
    if len(nums) < 2:
        return None
    return sorted(nums)[-2]
""",
    "code-train-12-chunk": """def chunk(items, size):
    return [items[i:i + size] for i in range(0, len(items) - size + 1, size)]
""",
    "code-train-13-flatten": """def flatten(nested):
    out = []
    for item in nested:
        if isinstance(item, list):
            out.extend(item)
        else:
            out.append(item)
    return out
""",
    "code-train-14-phrase-palindrome": """def is_phrase_palindrome(text):
    lowered = text.lower()
    return lowered == lowered[::-1]
""",
    "code-train-15-parse-kv": """def parse_kv(text):
    result = {}
    for piece in text.split(";"):
        if piece:
            key, value = piece.split("=", 1)
            result[key] = value
    return result
""",
    "code-train-16-gcd-all": """def gcd_all(nums):
    from math import gcd

    result = nums[0]
    for n in nums[1:]:
        result = gcd(result, n)
    return result
""",
    "code-train-17-collatz-steps": """def collatz_steps(n):
    steps = 1
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps
""",
    "code-train-18-capitalize-words": """def capitalize_words(text):
    return " ".join(word.capitalize() for word in text.split())
""",
    "code-train-19-rotate-right": """def rotate_right(items, k):
    if not items:
        return []
    return items[-k:] + items[:-k]
""",
    "code-train-20-dedupe": """def dedupe(items):
    return sorted(set(items))
""",
    "code-train-21-longest-zero-gap": """def longest_zero_gap(n):
    return max(len(gap) for gap in bin(n)[2:].split("1"))
""",
    "code-train-22-count-pairs-with-sum": """def count_pairs_with_sum(nums, target):
    count = 0
    for i in range(len(nums)):
        for j in range(i, len(nums)):
            if nums[i] + nums[j] == target:
                count += 1
    return count
""",
    "code-train-23-running-total": """def running_total(nums):
    out = []
    total = 0
    for x in nums:
        out.append(total)
        total += x
    return out
""",
    "code-train-24-most-common-word": """def most_common_word(text):
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return min(counts, key=lambda w: (-counts[w], w))
""",
    "code-train-25-snake-to-camel": """def snake_to_camel(name):
    return "".join(word.capitalize() for word in name.split("_"))
""",
    "code-train-26-diagonal-sum": """def diagonal_sum(matrix):
    n = len(matrix)
    return sum(matrix[i][i] + matrix[i][n - 1 - i] for i in range(n))
""",
    "code-train-27-is-valid-ipv4": """def is_valid_ipv4(s):
    parts = s.split(".")
    if len(parts) != 4:
        return False
    for part in parts:
        if not (part.isascii() and part.isdigit()):
            return False
        if int(part) > 255:
            return False
    return True
""",
    "code-train-28-squeeze": """def squeeze(text):
    return "".join(dict.fromkeys(text))
""",
    "code-train-29-nth-prime": """def nth_prime(n):
    count = 0
    candidate = 1
    while count < n:
        candidate += 1
        if all(candidate % d for d in range(2, int(candidate ** 0.5))):
            count += 1
    return candidate
""",
    "code-train-30-group-anagrams": """def group_anagrams(words):
    groups = {}
    for word in words:
        groups.setdefault("".join(sorted(word)), []).append(word)
    return sorted(groups.values())
""",
    "code-train-31-mask-digits": """def mask_digits(card):
    head = "".join("*" if ch.isdigit() else ch for ch in card[:-4])
    return head + card[-4:]
""",
    "code-train-32-is-leap-year": """def is_leap_year(year):
    return year % 4 == 0 and year % 100 != 0
""",
    "code-train-33-to-seconds": """def to_seconds(stamp):
    parts = [int(p) for p in stamp.split(":")]
    return parts[-2] * 60 + parts[-1]
""",
    "code-train-34-interleave": """def interleave(a, b):
    return [x for pair in zip(a, b) for x in pair]
""",
    "code-train-35-digital-root": """def digital_root(n):
    return sum(int(d) for d in str(n))
""",
    "code-train-36-longest-run": """def longest_run(items):
    if not items:
        return 0
    best = current = 1
    for i in range(1, len(items)):
        if items[i] == items[i - 1]:
            current += 1
        else:
            best = max(best, current)
            current = 1
    return best
""",
    "code-heldout-01-format-duration": """def format_duration(seconds):
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v]
    return " ".join(parts)
""",
    "code-heldout-02-median": """def median(nums):
    return sorted(nums)[len(nums) // 2]
""",
    "code-heldout-03-rle-decode": """def rle_decode(code):
    return "".join(code[i] * int(code[i + 1]) for i in range(0, len(code), 2))
""",
    "code-heldout-04-pascal-row": """def pascal_row(n):
    from math import comb

    return [comb(n, k) for k in range(n)]
""",
    "code-heldout-05-binary-search": """def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
""",
    "code-heldout-06-triangle-kind": """def triangle_kind(a, b, c):
    x, y, z = sorted((a, b, c))
    if x + y < z:
        return "invalid"
    if x == z:
        return "equilateral"
    if x == y or y == z:
        return "isosceles"
    return "scalene"
""",
    "code-heldout-07-hex-to-rgb": """def hex_to_rgb(color):
    digits = color.lstrip("#")
    return tuple(int(digits[i:i + 2], 16) for i in (0, 2, 4))
""",
    "code-heldout-08-flatten-dict": """def flatten_dict(d):
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                out[key + "." + sub] = inner
        else:
            out[key] = value
    return out
""",
    "code-heldout-09-stair-ways": """def stair_ways(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
""",
    "code-heldout-10-luhn-valid": """def luhn_valid(number):
    digits = [int(ch) for ch in number if ch != " "]
    if len(digits) < 2:
        return False
    total = 0
    for i, d in enumerate(digits):
        if i % 2 == 1:
            d = d * 2 - 9 if d * 2 > 9 else d * 2
        total += d
    return total % 10 == 0
""",
    "code-heldout-11-acronym": """def acronym(phrase):
    return "".join(word[0].upper() for word in phrase.split())
""",
    "code-heldout-12-camel-to-snake": """def camel_to_snake(name):
    out = []
    for ch in name:
        if ch.isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)
""",
}
