"""Where the test suite's CPU time goes: sums the lines tests/conftest.py writes with
PADDLE_RESNET_TEST_CPU_LOG set, by track and test file, the most first, with the largest
resident memory of the worker after one of them.

    PADDLE_RESNET_TEST_CPU_LOG=/tmp/cpu.jsonl bash scripts/test.sh -q
    python scripts/suite_cpu.py /tmp/cpu.jsonl [--most 30] [--tests]
"""

import argparse
import collections
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--most", type=int, default=30, help="rows to print")
    parser.add_argument("--tests", action="store_true", help="by test, not by file")
    args = parser.parse_args()
    cpu, wall, count = collections.Counter(), collections.Counter(), collections.Counter()
    tracks, resident = collections.Counter(), {}
    with open(args.log) as log:
        for row in map(json.loads, log):
            where = row["test"] if args.tests else row["test"].split("::")[0]
            key = (row["track"], where)
            cpu[key] += row["cpu"]
            wall[key] += row["wall"]
            count[key] += 1
            resident[key] = max(resident.get(key, 0), row.get("rss_mb", 0))  # the worker's
            tracks[row["track"]] += row["cpu"]
    total = sum(tracks.values())
    print(
        f"{total:.0f} CPU-seconds in tests: " + ", ".join(f"{t} {s:.0f}" for t, s in tracks.items())
    )
    print(f"{'CPU s':>8} {'share':>6} {'wall s':>8} {'tests':>5} {'RSS MB':>7}  track  where")
    for key, seconds in cpu.most_common(args.most):
        print(
            f"{seconds:8.1f} {seconds / total:6.1%} {wall[key]:8.1f} {count[key]:5d} "
            f"{resident[key]:7d}  {key[0]}  {key[1]}"
        )


if __name__ == "__main__":
    main()
