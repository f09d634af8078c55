"""The aligner's timestamp classes to word times, exactly as the official implementation computes them
(the same repair of non-monotonic predictions, the same integer truncation and rounding), in
O(n log n) instead of O(n^2)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def fix_timestamps(values: Sequence[float]) -> list[int]:
    """Repair predicted timestamps (ms) that go backwards, exactly as the official `fix_timestamp`.

    The longest non-decreasing subsequence is kept as it is; the official choice among equally long
    ones is reproduced (it ends at the first index reaching the maximal length, and each element's
    predecessor is the earliest one giving it its length). A run of at most two other values takes the
    nearer kept neighbour (the left one on a tie), a longer run is spaced evenly between its kept
    neighbours (or copies the one neighbour at an end). Every value is then truncated with int().
    O(n log n). An empty input gives [] (the official function raises ValueError there); NaN is
    refused with ValueError.
    """
    data = values.tolist() if hasattr(values, "tolist") else list(values)
    count = len(data)
    if count == 0:
        return []
    if any(value != value for value in data):
        raise ValueError("fix_timestamps: NaN among the timestamps")

    # For each length L, the indices whose longest non-decreasing run ending there has length L, in
    # index order; their values strictly decrease (an equal or larger later one would be longer), so
    # the earliest index with a value <= v is found by bisection on the negated values.
    by_length_index: list[list[int]] = []
    by_length_negated: list[list[float]] = []
    tails: list[float] = []  # the smallest (= latest) value of each length, non-decreasing in length
    parent = [-1] * count
    best_length = 0
    best_end = 0
    for index, value in enumerate(data):
        length = bisect.bisect_right(tails, value) + 1
        if length > 1:
            candidates = by_length_negated[length - 2]
            parent[index] = by_length_index[length - 2][bisect.bisect_left(candidates, -value)]
        if length > len(tails):
            tails.append(value)
            by_length_index.append([index])
            by_length_negated.append([-value])
        else:
            tails[length - 1] = value
            by_length_index[length - 1].append(index)
            by_length_negated[length - 1].append(-value)
        if length > best_length:
            best_length, best_end = length, index

    normal = [False] * count
    index = best_end
    while index != -1:
        normal[index] = True
        index = parent[index]

    result = list(data)
    start = 0
    while start < count:
        if normal[start]:
            start += 1
            continue
        stop = start
        while stop < count and not normal[stop]:
            stop += 1
        left = result[start - 1] if start > 0 else None
        right = result[stop] if stop < count else None
        run = stop - start
        for k in range(start, stop):
            if left is None:
                result[k] = right
            elif right is None:
                result[k] = left
            elif run <= 2:
                result[k] = left if (k - (start - 1)) <= (stop - k) else right
            else:
                step = (right - left) / (run + 1)
                result[k] = left + step * (k - start + 1)
        start = stop
    return [int(value) for value in result]


def word_times(classes: Sequence[int], segment_time_ms: float, n_items: int) -> list[tuple[float, float]]:
    """(start, end) in seconds for each of `n_items` items from the aligner's timestamp classes.

    As the official aligner: each class times `segment_time_ms` in float32 is a time in ms; the
    times are repaired with fix_timestamps; item i gets the (2i)th and (2i+1)th, in seconds rounded to
    3 decimals. `classes` holds the predictions at the prompt's timestamp tokens, 2 per item (the
    prompt of a text without items still has 2; those, or none, are accepted for n_items == 0).
    Raises ValueError when the count is not that.
    """
    import numpy as np

    if n_items < 0:
        raise ValueError(f"word_times: n_items must be >= 0, got {n_items}")
    count = len(classes)
    if n_items == 0:
        if count not in (0, 2):
            raise ValueError(f"word_times: a text without items has 2 timestamp classes, got {count}")
        return []
    if count != 2 * n_items:
        raise ValueError(
            f"word_times: {n_items} items need 2 * {n_items} = {2 * n_items} timestamp classes, got {count}"
        )
    milliseconds = np.asarray(classes, dtype=np.float32) * np.float32(segment_time_ms)
    fixed = fix_timestamps(milliseconds.tolist())
    return [
        (round(fixed[2 * index] / 1000.0, 3), round(fixed[2 * index + 1] / 1000.0, 3))
        for index in range(n_items)
    ]


__all__ = ["fix_timestamps", "word_times"]
