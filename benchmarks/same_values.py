"""Do two runs log the same values? The check that a change which should not touch the arithmetic did not.

    python benchmarks/same_values.py [--prefix] RUN_DIR_A RUN_DIR_B

Run the same short command (same seed, on the CPU) at the old and at the new commit, then compare the two run
folders: every scalar tag, every step, every value must be equal, bit for bit. Only what measures the machine
(charts/SPS) is left out. Prints one line per tag that differs and exits 1 if any does, else says how much was
compared and exits 0 (2: bad input, one error line). With --prefix, only the steps that both runs have logged
on every tag are compared: a run still training against a longer one, or a run started over against the
partial curve of the one it replaces.
"""

import os
import sys

IGNORED = {"charts/SPS"}  # wall-clock speed: differs between any two runs


def scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"] if tag not in IGNORED}


def differences(a, b):
    """One line per tag that is missing on one side or whose (step, value) sequence differs."""
    lines = []
    for tag in sorted(set(a) | set(b)):
        if tag not in a or tag not in b:
            lines.append(f"{tag}: only in {'the first' if tag in a else 'the second'} run")
        elif a[tag] != b[tag]:
            first = next((i for i, (x, y) in enumerate(zip(a[tag], b[tag])) if x != y), min(len(a[tag]), len(b[tag])))
            lines.append(f"{tag}: {len(a[tag])} and {len(b[tag])} points, first difference at point {first}")
    return lines


def common_prefix(a, b):
    """a and b cut to the steps up to the last one that every tag of both has reached."""
    last = min(points[-1][0] for points in [*a.values(), *b.values()] if points)
    return ({tag: [p for p in points if p[0] <= last] for tag, points in run.items()} for run in (a, b))


def main(argv):
    prefix = "--prefix" in argv
    argv = [arg for arg in argv if arg != "--prefix"]
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    missing = [run_dir for run_dir in argv if not os.path.isdir(run_dir)]
    if missing:
        print(f"error: no such run folder: {missing[0]}", file=sys.stderr)
        return 2
    a, b = scalars(argv[0]), scalars(argv[1])
    for run_dir, run in zip(argv, (a, b)):
        if not run:
            print(f"error: no scalars in {run_dir}", file=sys.stderr)
            return 2
    if prefix:
        a, b = common_prefix(a, b)
    lines = differences(a, b)
    for line in lines:
        print(line)
    if not lines:
        up_to = f" up to step {max(p[0] for points in a.values() for p in points)}" if prefix else ""
        print(f"same values: {len(a)} tags, {sum(map(len, a.values()))} points{up_to} (charts/SPS left out)")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
