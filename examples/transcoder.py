"""Seed 003's video transcoder: ffmpeg jobs on the durable queue, each in a child process;
a malformed input and a crashing child fail only their own job (exit code recorded), a
worker SIGKILLed mid-transcode loses nothing, and progress shows per job.

    apt-get install -y ffmpeg
    python examples/transcoder.py              # about 10 s
    python examples/transcoder.py --clips 2 --json

The code is foundry/examples/transcoder.py (the worker and its children import it).
"""

from foundry.examples.transcoder import main

if __name__ == "__main__":
    raise SystemExit(main())
