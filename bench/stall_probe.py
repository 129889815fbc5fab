"""Machine stall probe: how long this core can go without running a sleeping thread.

Sleeps 1 ms in a loop and writes every overshoot beyond `--min-ms` as a JSON line
`{"at": UNIX_SECONDS, "gap_ms": GAP}` (the instant the sleep should have ended and how long
it took instead), until SIGTERM or SIGINT. On a virtual machine a gap of tens of milliseconds
with the core otherwise idle is the host taking the virtual CPU away (it shows as `steal` in
/proc/stat); `bench/run.py` runs one probe per core beside its rows, so a tail that only a
stall explains can be told apart from one the client caused.
"""

import argparse
import json
import signal
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="file the gaps are appended to")
    parser.add_argument("--min-ms", type=float, default=2.0, help="smallest gap written")
    args = parser.parse_args()
    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with open(args.out, "a", encoding="utf-8") as out:
        before = time.monotonic()
        while running:
            time.sleep(0.001)
            now = time.monotonic()
            gap_ms = (now - before) * 1000.0
            if gap_ms >= args.min_ms:
                wall = time.time() - (now - before)
                out.write(json.dumps({"at": round(wall, 4), "gap_ms": round(gap_ms, 3)}) + "\n")
                out.flush()
            before = now
    return 0


if __name__ == "__main__":
    sys.exit(main())
