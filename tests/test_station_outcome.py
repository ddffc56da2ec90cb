"""What a rejected station's ``outcome`` (zeromq.md 4.4.3) says in words: the daemon's log
(``human.station_line``) and ``cellcal demo`` (``human.outcome_words``) never say a station
is measured again when it was given up, dropped, or the run ended with it."""

from __future__ import annotations

import pytest

from cellcal.daemon import bodies
from cellcal.daemon.jobs.run import OUTCOME_DROPPED, OUTCOME_GIVEN_UP, OUTCOME_RETRY, OUTCOME_RUN_FAILED
from cellcal.daemon.report import human


def _body(outcome: str | None, attempt: int = 2) -> dict:
    b = bodies.station(run_id=4, index=6, planned=8, attempt=attempt, accepted_count=5, figures={},
                       rejected="consensus_outlier", message="consensus_outlier: 25.000 mm from the fit")
    return dict(b if outcome is None else bodies.with_outcome(b, outcome))


@pytest.mark.parametrize(("outcome", "words"), [
    (OUTCOME_RETRY, "rejected on attempt 2, measuring it again"),
    (OUTCOME_GIVEN_UP, "GIVEN UP after 2 attempts"),
    (OUTCOME_DROPPED, "DROPPED from the run after it was accepted"),
    (OUTCOME_RUN_FAILED, "rejected on attempt 2; the run fails"),
    (None, "rejected on attempt 2"),  # a body from a daemon before the outcome was published
])
def test_each_outcome_is_said_as_it_is(outcome, words):
    body = _body(outcome)
    assert human.outcome_words(body) == words
    line = human.station_line(body)
    assert line.startswith(f"run 4: station 7/8 {words} (consensus_outlier): ") and "25.000 mm" in line
    if outcome not in (OUTCOME_RETRY, None):
        assert "again" not in line and "retry" not in line
