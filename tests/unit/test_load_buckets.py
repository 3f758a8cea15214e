"""Load samples into time buckets (control_plane/services/load_buckets.py): rates from a counter's
growth per broker, gauges as last seen, brokers summed, gaps between a broker's samples filled."""

from __future__ import annotations

import datetime as dt

from control_plane.services.load_buckets import Sample, bucket_starts, bucketize, step_for, totals

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_the_step_gives_about_120_buckets_of_whole_minutes() -> None:
    assert step_for(dt.timedelta(hours=1)) == MINUTE
    assert step_for(dt.timedelta(days=1)) == dt.timedelta(minutes=12)
    assert step_for(dt.timedelta(seconds=10)) == MINUTE
    starts = bucket_starts(at(30), at(185), MINUTE)
    assert starts == [T0, T0 + MINUTE, T0 + 2 * MINUTE, T0 + 3 * MINUTE]


def test_rates_and_gauges_per_bucket_summed_across_brokers() -> None:
    starts = bucket_starts(T0, at(180), MINUTE)
    samples = [
        Sample("a", at(-10), 100, 7),  # before the range: the first bucket's baseline
        Sample("a", at(20), 200, 9),
        Sample("a", at(50), 400, 5),  # a's last in bucket 0: 300 messages over 60 s
        Sample("a", at(110), 1000, 2),  # 600 over 60 s
        Sample("b", at(55), 10, 1),  # b's first: alone in its bucket, no rate yet; its gauge counts
        Sample("b", at(115), 70, 3),  # 60 over 60 s
        Sample("c", at(70), 100, 4),  # c's first bucket: from its first sample to its last, 30 over 30 s
        Sample("c", at(100), 130, 1),
    ]
    b0, b1, b2 = bucketize(samples, starts, MINUTE)
    assert (b0.rate, b0.gauge) == (5.0, 5 + 1)
    assert (b1.rate, b1.gauge) == (10.0 + 1.0 + 1.0, 2 + 3 + 1)
    assert (b2.rate, b2.gauge) == (None, None)  # nobody reported


def test_buckets_between_two_samples_of_a_broker_take_that_intervals_rate() -> None:
    starts = bucket_starts(T0, at(300), MINUTE)
    samples = [Sample("a", at(10), 0, 4), Sample("a", at(250), 480, 0)]  # idle item: one sample every few minutes
    got = bucketize(samples, starts, MINUTE)
    assert [b.rate for b in got] == [None, 2.0, 2.0, 2.0, 2.0]
    assert [b.gauge for b in got] == [4, 4, 4, 4, 0]


def test_a_counter_that_went_back_gives_no_rate() -> None:
    starts = bucket_starts(T0, at(120), MINUTE)
    got = bucketize([Sample("a", at(10), 500), Sample("a", at(70), 20)], starts, MINUTE)
    assert [b.rate for b in got] == [None, None]
    assert [b.gauge for b in got] == [0, 0]


def test_totals_add_every_sample_of_a_bucket() -> None:
    starts = bucket_starts(T0, at(120), MINUTE)
    samples = [
        Sample("a", at(-5), 0, 100),
        Sample("a", at(10), 0, 2),
        Sample("b", at(20), 0, 3),
        Sample("a", at(70), 0, 1),
    ]
    assert totals(samples, starts, MINUTE) == [5, 1]
