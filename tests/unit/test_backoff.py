from hypothesis import given
from hypothesis import strategies as st

from skiplock.backoff import backoff_seconds


def test_doubles_until_the_cap_without_jitter():
    delays = [backoff_seconds(n, base=5, cap=60, jitter=0) for n in range(1, 8)]
    assert delays == [5, 10, 20, 40, 60, 60, 60]


def test_full_jitter_spans_zero_to_the_ceiling():
    assert backoff_seconds(3, base=5, cap=60, jitter=1, rand=lambda: 0.0) == 20
    assert backoff_seconds(3, base=5, cap=60, jitter=1, rand=lambda: 0.999999) < 0.001
    assert backoff_seconds(3, base=5, cap=60, jitter=0.5, rand=lambda: 1.0) == 10


def test_huge_attempt_counts_do_not_overflow():
    assert backoff_seconds(10_000, base=5, cap=3600, jitter=0) == 3600


@given(
    attempts=st.integers(min_value=0, max_value=10_000),
    base=st.floats(min_value=0.001, max_value=1000),
    cap_factor=st.floats(min_value=1, max_value=1000),
    jitter=st.floats(min_value=0, max_value=1),
    r=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_delay_is_always_within_bounds(attempts, base, cap_factor, jitter, r):
    cap = base * cap_factor
    delay = backoff_seconds(attempts, base=base, cap=cap, jitter=jitter, rand=lambda: r)
    ceiling = min(cap, base * 2 ** min(max(attempts - 1, 0), 62))
    assert 0 <= delay <= ceiling * (1 + 1e-9)
    assert delay >= ceiling * (1 - jitter) * (1 - 1e-9)
