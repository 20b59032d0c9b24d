"""Seed 003's third candidate, for real: a video transcoder on the durable queue, each job
in a child process.

``python examples/transcoder.py`` (``--clips 4 --json``). Needs Debian's ``ffmpeg``
(``apt-get install -y ffmpeg``).

``transcode`` is declared ``durable=True, isolate=True, est="90s"`` → ``queue/processes``,
decided by *isolation*: a malformed video may crash a native decoder, and a crash must not
take the worker (or the other jobs) down. The run:

1. generates short test clips with ffmpeg's ``lavfi`` source (1 s, 160×120: tiny), plus a
   malformed file, and submits one job per file to the queue in the app's home;
2. starts a ``foundry worker`` process; each job runs ``ffmpeg -re`` (read at the clip's
   own rate, so a 1 s clip takes about a second, like a real transcode at speed ×1) in a
   child of the worker, and reports ``foundry.progress(frame, frames, "frames")`` from
   ffmpeg's ``-progress`` output — shown per job in ``foundry jobs list`` and the
   dashboard;
3. SIGKILLs the worker while a job is mid-transcode, and starts another: the job's lease
   lapses and it is delivered again (nothing lost; its ``deliveries`` says 2);
4. the malformed input fails its own job with ffmpeg's exit code in the error, and a job
   whose child is made to crash (``crash_at``: a SIGSEGV at that frame, standing in for a
   decoder bug) fails with ``ChildCrashedError`` and exit code -11; every other job
   succeeds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import foundry
from foundry import Foundry

__all__ = ["TranscodeError", "TranscodeReport", "app", "make_clip", "run", "transcode"]

app = Foundry("transcoder")

FFMPEG_TIMEOUT = 120.0  # seconds one ffmpeg run may take before it is killed


class TranscodeError(RuntimeError):
    """ffmpeg exited with a non-zero status: the input or the options are wrong."""

    def __init__(self, message: str, returncode: int) -> None:
        super().__init__(message)
        self.returncode = returncode

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.returncode))


app.errors.register(TranscodeError)


def ffmpeg() -> str | None:
    """The ffmpeg binary, or ``None`` when it is not installed."""
    return shutil.which("ffmpeg")


def make_clip(path: Path, *, seconds: float = 1.0, size: str = "160x120", rate: int = 25) -> Path:
    """A short generated test clip (ffmpeg's ``testsrc``), H.264 in MP4."""
    subprocess.run(
        [ffmpeg() or "ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
         f"testsrc=duration={seconds}:size={size}:rate={rate}", "-c:v", "libx264", "-preset", "ultrafast",
         "-pix_fmt", "yuv420p", str(path)],
        check=True, capture_output=True, timeout=FFMPEG_TIMEOUT,
    )  # fmt: skip
    return path


def frames_of(src: str) -> int | None:
    """How many video frames ``src`` has (ffprobe), or ``None`` when it cannot tell."""
    probe = shutil.which("ffprobe")
    if probe is None:
        return None
    done = subprocess.run(
        [probe, "-v", "error", "-select_streams", "v:0", "-count_packets", "-show_entries",
         "stream=nb_read_packets", "-of", "csv=p=0", src],
        capture_output=True, text=True, timeout=FFMPEG_TIMEOUT,
    )  # fmt: skip
    try:
        return int(done.stdout.strip().strip(","))
    except ValueError:
        return None


@app.work(durable=True, isolate=True, est="90s", bound="cpu", timeout="5m", retries=0)
def transcode(src: str, dst: str, crash_at: int | None = None) -> dict[str, Any]:
    """Transcode ``src`` to MPEG-4 at 15 fps in ``dst`` with ffmpeg, reporting progress per
    frame; ``crash_at`` makes this child process crash (SIGSEGV) at that frame."""
    total = frames_of(src)
    command = [
        ffmpeg() or "ffmpeg", "-hide_banner", "-loglevel", "error", "-nostats", "-y", "-re", "-i", src,
        "-c:v", "mpeg4", "-q:v", "5", "-r", "15", "-progress", "pipe:1", dst,
    ]  # fmt: skip
    started = time.monotonic()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        frame = 0
        for line in proc.stdout:
            key, _, value = line.strip().partition("=")
            if key == "frame" and value.isdigit():
                # ffmpeg counts output frames: at -r 15 from 25 fps, 15 per second of input
                frame = int(value)
                out_total = None if total is None else max(1, round(total * 15 / 25))
                foundry.progress(min(frame, out_total or frame), out_total, "frames")
                if crash_at is not None and frame >= crash_at:
                    proc.kill()
                    os.kill(os.getpid(), signal.SIGSEGV)  # a native decoder's bug, simulated
            if time.monotonic() - started > FFMPEG_TIMEOUT:
                proc.kill()
        errors = proc.stderr.read()
        code = proc.wait(timeout=FFMPEG_TIMEOUT)
    if code != 0:
        tail = " ".join(errors.strip().splitlines()[-2:])[:300]
        raise TranscodeError(f"ffmpeg exited with status {code} on {Path(src).name}: {tail}", code)
    return {"dst": dst, "bytes": Path(dst).stat().st_size, "frames": frame}


# -- the run ------------------------------------------------------------------------------------


@dataclass
class JobRow:
    name: str
    id: str
    status: str
    deliveries: int
    progress: str
    outcome: str
    exit_code: int | None


@dataclass
class TranscodeReport:
    decision: str
    decided_by: str
    why: str
    jobs: list[JobRow]
    killed_job: str | None
    killed_at: str
    seconds: float
    queue_url: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _worker(home: Path, queue_url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FOUNDRY_HOME": str(home), "FOUNDRY_QUEUE": queue_url}
    with (home / "worker.log").open("ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "foundry.cli", "worker", "foundry.examples.transcoder:app",
             "--concurrency", "2", "--lease", "1s", "--grace", "2s", "--quiet"],
            env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)


def run(
    clips: int = 4,
    *,
    workdir: Path | None = None,
    console: Any = None,
    timeout: float = 120.0,
    progress: Callable[[float], None] | None = None,
) -> TranscodeReport:
    """Generate, submit, run on a worker process, kill it mid-transcode, run on another."""
    from foundry.backends.queue import JobStatus, open_queue_backend

    if ffmpeg() is None:
        raise RuntimeError("ffmpeg is not installed. Fix: apt-get install -y ffmpeg")
    where = Path(tempfile.mkdtemp(prefix="foundry-transcode-")) if workdir is None else workdir
    queue_url = f"sqlite:///{where / 'queue.db'}"
    local = Foundry("transcoder", queue=queue_url)
    unit = local.work(
        durable=True, isolate=True, est="90s", bound="cpu", timeout="5m", retries=0, name="transcode"
    )(transcode.fn)
    decision = unit.decision
    names: dict[str, str] = {}
    started = time.monotonic()
    for i in range(clips):
        src = make_clip(where / f"clip-{i}.mp4")
        names[unit.submit(str(src), str(where / f"clip-{i}.avi")).id] = src.name
    bad = where / "malformed.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(4096))  # an MP4 header, then noise
    names[unit.submit(str(bad), str(where / "malformed.avi")).id] = bad.name
    crash_src = make_clip(where / "crashes.mp4")
    names[unit.submit(str(crash_src), str(where / "crashes.avi"), crash_at=5).id] = "crashes.mp4 (crash_at=5)"
    local.close()

    backend = open_queue_backend(queue_url)
    killed_job: str | None = None
    killed_at = ""
    worker = _worker(where, queue_url)
    try:
        deadline = time.monotonic() + timeout
        while killed_job is None:  # wait for a good clip mid-transcode, then SIGKILL the worker
            if time.monotonic() > deadline:
                raise TimeoutError("no job reached the middle of its transcode in time")
            for job_id, name in names.items():
                state = backend.get(job_id)
                fraction = None if state is None or state.progress is None else state.progress.fraction
                if (
                    name.startswith("clip-")
                    and state is not None
                    and state.status is JobStatus.RUNNING
                    and fraction
                    and 0.2 <= fraction < 0.9
                ):
                    killed_job, killed_at = job_id, state.progress.describe() if state.progress else ""
                    break
            time.sleep(0.02)
        _stop(worker, signal.SIGKILL)
        if console is not None:
            console.print(
                f"   [red]SIGKILL[/red] the worker while {names[killed_job]} was at {killed_at}; "
                "starting another"
            )
        worker = _worker(where, queue_url)
        pending = set(names)
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"jobs not finished in {timeout:.0f} s: {sorted(names[j] for j in pending)}"
                )
            for job_id in list(pending):
                state = backend.get(job_id)
                if state is not None and state.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
                    pending.discard(job_id)
            if progress is not None:
                progress(1 - len(pending) / len(names))
            time.sleep(0.05)
    finally:
        _stop(worker)
    rows = []
    for job_id, name in names.items():
        state = backend.get(job_id)
        assert state is not None
        error = json.loads(state.error) if state.error else None
        code: int | None = None
        outcome = ""
        if state.result is not None:
            result = json.loads(state.result)
            outcome = f"{result['bytes']:,} bytes, {result['frames']} frames"
        elif error is not None:
            args = error.get("args") or []
            code = next((a for a in reversed(args) if isinstance(a, int) and not isinstance(a, bool)), None)
            message = str(error.get("message", "")).split(": /", 1)[0].split("; only", 1)[0]
            outcome = f"{error.get('type', '').rsplit('.', 1)[-1]}: {message}"[:120]
        rows.append(
            JobRow(
                name=name,
                id=job_id,
                status=state.status.value,
                deliveries=state.deliveries,
                progress="" if state.progress is None else state.progress.describe(),
                outcome=outcome,
                exit_code=code,
            )
        )
    backend.close()
    return TranscodeReport(
        decision=decision.model,
        decided_by=decision.decided_by,
        why=decision.deciding_answer,
        jobs=rows,
        killed_job=killed_job,
        killed_at=killed_at,
        seconds=time.monotonic() - started,
        queue_url=queue_url,
    )


def show(report: TranscodeReport, console: Any) -> None:
    from rich.table import Table

    console.print(
        f"transcode → [cyan]{report.decision}[/cyan], decided by [bold]{report.decided_by}[/bold]: "
        f"{report.why}"
    )
    table = Table(
        title=f"{len(report.jobs)} jobs on the durable queue, each in a child process "
        f"({report.seconds:.1f} s)"
    )
    for column in ("input", "status", "deliv.", "progress", "exit", "outcome"):
        table.add_column(column, overflow="fold", ratio=3 if column == "outcome" else None)
    style = {"succeeded": "green", "failed": "red", "dead": "magenta"}
    for row in report.jobs:
        s = style.get(row.status, "")
        killed = " [red](worker SIGKILLed)[/red]" if row.id == report.killed_job else ""
        table.add_row(
            row.name + killed,
            f"[{s}]{row.status}[/{s}]" if s else row.status,
            str(row.deliveries),
            row.progress,
            "" if row.exit_code is None else str(row.exit_code),
            row.outcome,
        )
    console.print(table)
    console.print(f"[dim]the jobs, with their progress: foundry jobs list --url {report.queue_url}[/dim]")


def main(argv: list[str] | None = None) -> int:
    import argparse

    from rich.console import Console

    parser = argparse.ArgumentParser(description="seed 003's video transcoder on the durable queue")
    parser.add_argument("--clips", type=int, default=4, help="good clips to transcode (default 4)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.clips < 1:
        parser.error(f"--clips={args.clips}: give at least 1 (the SIGKILL needs a job mid-transcode)")
    if ffmpeg() is None:
        print("ffmpeg is not installed. Fix: apt-get install -y ffmpeg", file=sys.stderr)
        return 2
    console = Console(stderr=args.json)
    report = run(args.clips, console=console)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        show(report, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
