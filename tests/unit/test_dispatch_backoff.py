"""Retry backoff: exponential, capped, equal jitter."""

from __future__ import annotations

import random

import pytest

from orbit_node.domain.backoff import backoff_delay_ms


class Extreme(random.Random):
    """Jitter at one end of its range."""

    def __init__(self, high: bool):
        super().__init__()
        self.high = high

    def uniform(self, a, b):
        return b if self.high else a


@pytest.mark.parametrize(
    ("failed", "nominal"),
    [(1, 1000), (2, 2000), (3, 4000), (6, 32000), (20, 300000), (10_000, 300000)],
)
def test_exponential_capped_with_equal_jitter(failed, nominal):
    options = {"initial_ms": 1000, "max_ms": 300000, "multiplier": 2.0}
    assert backoff_delay_ms(failed, rng=Extreme(high=True), **options) == nominal
    assert backoff_delay_ms(failed, rng=Extreme(high=False), **options) == nominal // 2
    rng = random.Random(7)
    for _ in range(200):
        assert nominal // 2 <= backoff_delay_ms(failed, rng=rng, **options) <= nominal


def test_delays_spread_out():
    rng = random.Random(1)
    delays = {backoff_delay_ms(3, initial_ms=1000, max_ms=60000, multiplier=2.0, rng=rng) for _ in range(50)}
    assert len(delays) > 40


def test_degenerate_settings_stay_sane():
    assert backoff_delay_ms(5, initial_ms=0, max_ms=1000, multiplier=2.0) == 0
    # A multiplier below 1 never shrinks the delay below the initial one.
    assert backoff_delay_ms(5, initial_ms=100, max_ms=1000, multiplier=0.5, rng=Extreme(high=True)) == 100
    with pytest.raises(ValueError):
        backoff_delay_ms(0, initial_ms=1, max_ms=1, multiplier=2.0)
