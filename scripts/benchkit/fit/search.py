"""The search for the largest micro-batch whose training step fits a memory budget
(bench_fit.py): a bracket narrowed by probes placed on the line the measured steps
predict, bisecting when that stops halving it."""


def search(measure, budget, guess, slope, cap):
    """The largest r <= cap whose measure(r) (a step's peak bytes on r sentences)
    is within `budget`, 0 if none; returns (r, {probed r: peak}).

    A bracket [low, high): low fits (0: none known), high does not (cap + 1: none
    known). Each probe is the largest r that the probe nearest the budget predicts
    to fit, with `slope` bytes per sentence (from the measured steps; None: from
    the two probes farthest apart, doubling after the first), kept strictly inside
    the bracket; when both ends are known and the bracket has not halved in
    two probes, the probe is its middle instead (bisection). It ends when high =
    low + 1: the answer and the next count were both probed. While no count is
    known not to fit, probes stay at most one sentence above a prediction, so the
    search never runs a step far beyond the budget."""
    peaks = {}
    low, high = 0, cap + 1
    candidate = min(max(1, guess), cap)
    widths = []
    while True:
        peaks[candidate] = measure(candidate)
        if peaks[candidate] <= budget:
            low = candidate
        else:
            high = candidate
        if high - low <= 1:
            return low, peaks
        if slope is None and len(peaks) > 1:  # no measured line: the probes' own
            a, b = min(peaks), max(peaks)
            per = (peaks[b] - peaks[a]) / (b - a)
            step_slope = per if per > 0 else None
        else:
            step_slope = slope
        nearest = min(peaks, key=lambda r: abs(peaks[r] - budget))
        if step_slope is None:  # one probe and no line yet: double
            candidate = 2 * nearest
        else:
            candidate = nearest + int((budget - peaks[nearest]) // step_slope)
        widths.append(high - low)
        known = 0 < low and high <= cap
        if known and len(widths) >= 3 and widths[-1] > widths[-3] / 2:
            candidate = (low + high) // 2
        candidate = min(max(candidate, low + 1), high - 1)


def prediction(steps, budget, length):
    """(sentences, bytes per sentence) that the straight line through the two
    largest measured (tokens, peak) pairs predicts for `budget`; None if fewer
    than two sizes were measured or the line does not rise. (The smallest sizes
    can sit off the line: there the update's model-sized temporaries, not the
    activations, make the peak.)"""
    points = sorted((s["tokens"], s["peak"]) for s in steps)[-2:]
    if len(points) < 2 or points[0][0] == points[1][0]:
        return None
    (t0, p0), (t1, p1) = points
    per_token = (p1 - p0) / (t1 - t0)
    if per_token <= 0:
        return None
    return int((t1 + (budget - p1) / per_token) // length), per_token * length
