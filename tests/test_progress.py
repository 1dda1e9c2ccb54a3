"""Progress lines of the long stages: one line per report, an ETA from the mean rate, none between reports."""

from xtrain_backend_side.progress import Progress, progress_line


def test_the_line_shows_done_total_share_and_the_time_left_at_the_mean_rate():
    assert progress_line("tokenize: chats", 250, 1000, 30.0) == "tokenize: chats 250/1000 (25%); 30 s so far, ETA 00:01:30"
    # a resumed run: the rate counts only the steps done since it started (step 100)
    assert progress_line("step", 150, 200, 50.0, first=100, details="loss 1.2") == \
        "step 150/200 (75%) loss 1.2; 50 s so far, ETA 00:00:50"
    assert progress_line("step", 100, 200, 5.0, first=100).endswith("ETA ?")


def test_reports_are_rate_limited_but_the_last_one_is_always_written(monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 12.5, 13.0])
    monkeypatch.setattr("xtrain_backend_side.progress.time.monotonic", lambda: next(clock))
    lines = []
    progress = Progress(lines.append, "evaluate", 4, every=10)
    for _ in range(4):
        progress.advance()
    assert lines == ["evaluate 3/4 (75%); 12 s so far, ETA 00:00:04", "evaluate 4/4 (100%); 13 s so far, ETA 00:00:00"]
