"""Do two runs log the same values? The check that a change which should not touch the arithmetic did not.

    python benchmarks/same_values.py RUN_DIR_A RUN_DIR_B

Run the same short command (same seed, on the CPU) at the old and at the new commit, then compare the two run
folders: every scalar tag, every step, every value must be equal, bit for bit. Only what measures the machine
(charts/SPS) is left out. Prints one line per tag that differs and exits 1 if any does, else says how much was
compared and exits 0.
"""

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


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    a, b = scalars(argv[0]), scalars(argv[1])
    if not a:
        print(f"error: no scalars in {argv[0]}", file=sys.stderr)
        return 2
    lines = differences(a, b)
    for line in lines:
        print(line)
    if not lines:
        print(f"same values: {len(a)} tags, {sum(map(len, a.values()))} points (charts/SPS left out)")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
