#!/usr/bin/python3
"""Per-op self time of a LibTorch profile (chrome://tracing JSON, e.g. lm_step_bench --trace).

    bench/trace_summary.py TRACE [--top 30]

Self time is an op's duration less that of the ops it called (nested events of one thread).
"""

import argparse
import collections
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    with open(args.trace) as f:
        text = f.read().rstrip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    events = [e for e in json.loads(text) if e.get("ph") == "X"]
    by_thread = collections.defaultdict(list)
    for e in events:
        by_thread[e.get("tid", 0)].append(e)
    self_us = collections.Counter()
    calls = collections.Counter()
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [end, name, child time]
        for e in thread_events:
            while stack and stack[-1][0] <= e["ts"]:
                end, name, children, dur = stack.pop()
                self_us[name] += dur - children
            if stack:
                stack[-1][2] += e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], 0, e["dur"]])
            calls[e["name"]] += 1
        while stack:
            end, name, children, dur = stack.pop()
            self_us[name] += dur - children
    total = sum(self_us.values())
    print(f"{'op':<52} {'self ms':>9} {'share':>6} {'calls':>7}")
    for name, us in self_us.most_common(args.top):
        print(f"{name[:52]:<52} {us / 1000:>9.1f} {100 * us / total:>5.1f}% {calls[name]:>7}")
    print(f"{'total':<52} {total / 1000:>9.1f}")


if __name__ == "__main__":
    main()
