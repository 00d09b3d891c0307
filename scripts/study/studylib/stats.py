"""Medians and their 95% intervals, and the interval of a ratio of two runs' figures.

One run (no repeats): the figure is the median over the steps after warm-up, its interval the
distribution-free one of a median (order statistics, binomial), and a ratio's interval a
percentile bootstrap over the steps of both runs (fixed seed, so a report is reproducible).
Several repeats: the figure is the mean of the repeats' medians with a Student-t interval, and a
ratio's interval Welch's t on the logarithms of the repeats' medians."""
import math
import random

# Two-sided 95% quantiles of Student's t by degrees of freedom; between rows the smaller df's
# (wider) value is taken.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t975(df):
    if df >= 1000:
        return 1.960
    return _T975[max(k for k in _T975 if k <= max(1, int(df)))]


def median(xs):
    s = sorted(xs)
    n = len(s)
    return (s[(n - 1) // 2] + s[n // 2]) / 2


def median_interval(xs):
    """(lo, hi, coverage) of the median: the widest-inside order statistics whose binomial
    coverage is >= 95%, or (min, max) and their smaller coverage when there are too few values."""
    s = sorted(xs)
    n = len(s)
    cdf = [0.0]
    for k in range(n + 1):  # cdf[k + 1] = P(B <= k), B ~ Binomial(n, 1/2)
        cdf.append(cdf[-1] + math.comb(n, k) / 2 ** n)
    j = 0  # lo = s[j], hi = s[n-1-j]: coverage 1 - 2 P(B <= j)
    while j + 1 < n - 1 - (j + 1) and 1 - 2 * cdf[j + 2] >= 0.95:
        j += 1
    return s[j], s[n - 1 - j], 1 - 2 * cdf[j + 1]


def mean_interval(xs):
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    h = t975(n - 1) * sd / math.sqrt(n) if n > 1 else 0.0
    lo = max(0.0, m - h) if min(xs) >= 0 else m - h  # a time, rate or size is never below 0
    return m, lo, m + h


def summarize(per_repeat):
    """A figure from its per-step values, one list per repeat (empty lists left out)."""
    per_repeat = [r for r in per_repeat if r]
    if not per_repeat:
        return None
    if len(per_repeat) == 1:
        lo, hi, cov = median_interval(per_repeat[0])
        return {"value": median(per_repeat[0]), "lo": lo, "hi": hi, "n": len(per_repeat[0]), "over": "steps",
                "coverage": round(cov, 4)}
    m, lo, hi = mean_interval([median(r) for r in per_repeat])
    return {"value": m, "lo": lo, "hi": hi, "n": len(per_repeat), "over": "repeats", "coverage": 0.95}


def ratio(num, den, n_boot=2000, seed=0):
    """num / den of two figures given as per-step values, one list per repeat: value and 95% interval."""
    num, den = [r for r in num if r], [r for r in den if r]
    if not num or not den:
        return None
    if len(num) > 1 and len(den) > 1:
        return _ratio_repeats([median(r) for r in num], [median(r) for r in den])
    a, b = [x for r in num for x in r], [x for r in den for x in r]
    if median(b) <= 0:
        return None
    rng = random.Random(seed)
    boot = []
    for _ in range(n_boot):
        mb = median(rng.choices(b, k=len(b)))
        if mb > 0:
            boot.append(median(rng.choices(a, k=len(a))) / mb)
    boot.sort()
    return {"value": median(a) / median(b), "lo": boot[int(0.025 * len(boot))],
            "hi": boot[min(len(boot) - 1, int(0.975 * len(boot)))], "over": "steps"}


def _ratio_repeats(a, b):
    if min(a + b) <= 0:
        return None
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    ma, mb = sum(la) / len(la), sum(lb) / len(lb)
    va = sum((x - ma) ** 2 for x in la) / (len(la) - 1) / len(la)
    vb = sum((x - mb) ** 2 for x in lb) / (len(lb) - 1) / len(lb)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va ** 2 / (len(la) - 1)) + (vb ** 2 / (len(lb) - 1))) if se > 0 else 1000
    h = t975(df) * se
    return {"value": math.exp(ma - mb), "lo": math.exp(ma - mb - h), "hi": math.exp(ma - mb + h), "over": "repeats"}
