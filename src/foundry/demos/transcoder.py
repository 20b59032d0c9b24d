"""`foundry demo` section "transcoder": seed 003's video transcoder — ffmpeg jobs on the
durable queue in child processes, a malformed input, a crashing child, a worker SIGKILLed
mid-transcode (``foundry.examples.transcoder``). Skipped, saying how, without ffmpeg."""

from __future__ import annotations

from rich.console import Console

from foundry.demos._bar import bar


def run(console: Console) -> None:
    from foundry.examples import transcoder

    if transcoder.ffmpeg() is None:
        console.print(
            "[yellow]ffmpeg is not installed: apt-get install -y ffmpeg, then "
            "foundry demo --only transcoder[/yellow]"
        )
        return
    with bar(console, "transcoder: 2 clips, a malformed file, a crashing child") as advance:
        report = transcoder.run(2, console=console, progress=advance)
    transcoder.show(report, console)
    console.print(
        "[dim]docs/examples-transcoder.md · the dashboard shows each job's progress: foundry dashboard[/dim]"
    )
