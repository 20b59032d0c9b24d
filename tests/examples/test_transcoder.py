"""The transcoder example (``examples/transcoder.py``) at a reduced size: real ffmpeg jobs
on the durable queue in child processes of a real ``foundry worker`` process, which is
SIGKILLed mid-transcode. Asserts outcomes, never speed."""

from __future__ import annotations

from pathlib import Path

from foundry.examples import transcoder


def test_bad_input_and_a_crash_fail_alone_and_a_killed_worker_loses_nothing(
    ffmpeg_path: str, tmp_path: Path
) -> None:
    report = transcoder.run(1, workdir=tmp_path, timeout=90)
    # The decision: the queue for durability, processes for isolation
    assert report.decision == "queue/processes"
    assert report.decided_by == "isolation"
    jobs = {row.name: row for row in report.jobs}
    # Every good clip was transcoded, the one being transcoded when its worker was killed too
    assert report.killed_job in {row.id for row in report.jobs if row.name.startswith("clip-")}
    for name in ("clip-0.mp4",):
        assert jobs[name].status == "succeeded", jobs[name]
        assert jobs[name].progress.startswith("100%")
        assert (tmp_path / name.replace(".mp4", ".avi")).stat().st_size > 0
    killed = next(row for row in report.jobs if row.id == report.killed_job)
    assert killed.deliveries >= 2  # delivered again after the SIGKILL
    # The malformed input failed its own job with ffmpeg's exit status recorded
    bad = jobs["malformed.mp4"]
    assert (bad.status, bad.exit_code) == ("failed", 1)
    assert "TranscodeError" in bad.outcome
    # The crashing child failed its own job with the signal's exit code
    crashed = jobs["crashes.mp4 (crash_at=5)"]
    assert (crashed.status, crashed.exit_code) == ("failed", -11)
    assert "SIGSEGV" in crashed.outcome
    assert crashed.progress  # how far it got before it crashed
