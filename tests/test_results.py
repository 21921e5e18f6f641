"""Every published figure can be recomputed from the repository.

Each folder of benchmarks/results/ with a comparison.md says in its README.md the exact
`python benchmarks/compare.py ...` command that wrote it. Here that command runs again (without plots, into a
temporary folder) on the TensorBoard events committed in the folder, and:
- the regenerated comparison equals the committed comparison.md (its plot links aside);
- every figure the folder's README quotes (mean ± std, and bracketed intervals) is in the regenerated table,
  except in a paragraph that starts with "**Superseded", which keeps figures of an earlier run for the record,
  or with "**Published figures of other projects", which quotes them with their sources;
- every figure that benchmarks/results/README.md (the index) and the top-level README.md quote for the folder
  is in it too.
A folder whose events are not in the repository must say so in its README ("not recomputable from the
repository until re-run"); it is skipped by that marker, and the marker must go once events are committed.
Such a folder is re-run into its rerun/ folder; every finished re-run seed must reproduce the figure its
README published for that env and seed, while the re-run is under way and after.
The speed figures of throughput/ are read back from the events of the runs that logged them, and the ones the
READMEs quote must be the newest measurement's. same_seed/'s comparisons of runs value for value are made again.
"""

import contextlib
import importlib.util
import io
import itertools
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
MARKER = "not recomputable from the repository until re-run"

_spec = importlib.util.spec_from_file_location("compare", REPO / "benchmarks" / "compare.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)

FOLDERS = sorted(p.parent.name for p in RESULTS.glob("*/comparison.md"))
# A figure as the tables write it: "490.04 ± 6.12", "-82.01 ± 0.65", or an interval "0.04 [0.00, 0.24]".
FIGURE = re.compile(r"(?<![\d.])-?\d+\.\d+ (?:± \d+\.\d+|\[-?\d+\.\d+, -?\d+\.\d+\])")


def normalize(text):
    """The READMEs write minus signs as '−' and may group thousands with commas; the tables do neither."""
    return re.sub(r"(?<=\d),(?=\d{3})", "", text.replace("−", "-"))


def figures(text):
    return FIGURE.findall(normalize(text))


def current_text(readme):
    """A README without its paragraphs of superseded figures (those that start with "**Superseded"), of other
    projects' published figures (those that start with "**Published figures of other projects") and of figures
    that need what is not committed, such as a checkpoint's evaluation (those that start with "**Not
    recomputable from the events")."""
    left_out = ("**Superseded", "**Published figures of other projects", "**Not recomputable from the events")
    return "\n\n".join(p for p in readme.split("\n\n") if not p.lstrip().startswith(left_out))


def recomputable(folder):
    return MARKER not in (RESULTS / folder / "README.md").read_text().lower()


def compare_command(folder):
    """The last `python benchmarks/compare.py ...` command in the folder's README that writes into the folder
    itself (`--out benchmarks/results/FOLDER`: the one that wrote the committed comparison.md; others draw a
    curve elsewhere), as arguments for compare.main."""
    commands = [shlex.split(line.strip())[2:] for line in (RESULTS / folder / "README.md").read_text().splitlines()
                if line.strip().startswith("python benchmarks/compare.py")]
    into_folder = [args for args in commands
                   if "--out" in args and args[args.index("--out") + 1].rstrip("/") == f"benchmarks/results/{folder}"]
    assert into_folder, f"{folder}/README.md gives no `python benchmarks/compare.py ... --out benchmarks/results/{folder}`"
    return into_folder[-1]


_regenerated = {}


def regenerate(folder, tmp_dir):
    """The comparison of a recomputable folder, regenerated from its committed events (cached per folder)."""
    if folder not in _regenerated:
        args = compare_command(folder)
        if "--out" in args:  # into the temporary folder, not over the committed one
            i = args.index("--out")
            del args[i:i + 2]
        args += ["--out", str(tmp_dir / folder), "--no-plots"]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = compare.main(args)
        assert rc == 0, err.getvalue()
        _regenerated[folder] = (tmp_dir / folder / "comparison.md").read_text()
    return _regenerated[folder]


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("regenerated")


def content_lines(text):
    """The lines of a comparison.md that carry content: no blank lines, no plot links (--no-plots)."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("![")]


def table_text(folder, tmp_dir):
    """What a quoted figure of `folder` is checked against: its regenerated comparison, or, where the folder
    is marked as not recomputable, its committed one (then the check is only that the quote is consistent)."""
    if recomputable(folder):
        return regenerate(folder, tmp_dir)
    return (RESULTS / folder / "comparison.md").read_text()


def test_there_are_results_to_check():
    assert {"classic", "clip_ablation"} <= set(FOLDERS)
    assert any(recomputable(f) for f in FOLDERS)


def has_events(folder, outside_rerun=False):
    events = (RESULTS / folder).rglob("events.out.tfevents.*")
    if outside_rerun:
        events = (p for p in events if p.relative_to(RESULTS / folder).parts[0] != "rerun")
    return any(events)


@pytest.mark.parametrize("folder", FOLDERS)
def test_comparison_is_regenerated_from_the_committed_events(folder, tmp_dir):
    if not recomputable(folder):
        assert not has_events(folder, outside_rerun=True), (
            f"{folder}/ has events now: remove the '{MARKER}' marker from its README")
        pytest.skip(f"{folder}/README.md: {MARKER}")
    assert has_events(folder), (f"{folder}/ holds no TensorBoard events: commit them, or say in its README "
                                f"that it is {MARKER}")
    committed = (RESULTS / folder / "comparison.md").read_text()
    assert content_lines(regenerate(folder, tmp_dir)) == content_lines(committed)
    quoted = figures(current_text((RESULTS / folder / "README.md").read_text()))
    assert quoted, f"{folder}/README.md quotes no figures"
    table = regenerate(folder, tmp_dir)
    missing = [f for f in quoted if f not in table]
    assert not missing, f"{folder}/README.md quotes figures its regenerated table does not have: {missing}"


def index_rows():
    """(folder, figures) of each row of benchmarks/results/README.md that links a folder with a comparison."""
    rows = []
    for line in (RESULTS / "README.md").read_text().splitlines():
        m = re.match(r"\| \[(\w+)/\]\(\1/\)", line)
        if m and m[1] in FOLDERS:
            rows.append((m[1], figures(line)))
    return rows


def test_index_quotes_the_folders_tables(tmp_dir):
    rows = index_rows()
    assert {folder for folder, _ in rows} == set(FOLDERS)
    for folder, quoted in rows:
        assert quoted, f"the index row of {folder}/ quotes no figure"
        table = table_text(folder, tmp_dir)
        missing = [f for f in quoted if f not in table]
        assert not missing, f"benchmarks/results/README.md quotes for {folder}/ what its table lacks: {missing}"


def top_level_rows():
    """(script, env, our figure) of each row of the top-level README's results table: mean ± std over seeds, or
    a one-seed run's figure as compare.py writes it ("277.13 (1 seed)")."""
    rows = []
    for line in (REPO / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"`ppo_\w+\.py`", cells[0]):
            ours = figures(cells[3]) or re.findall(r"(?<![\d.])-?\d+\.\d+ \(1 seed\)", normalize(cells[3]))
            rows.append((cells[0].strip("`").removesuffix(".py"), cells[1], ours))
    return rows


def default_row(text, script, env):
    """The `default` variant's row of `env` in the `## script` section of a comparison, or None."""
    section = text.split(f"## {script}\n", 1)
    if len(section) < 2:
        return None
    section = section[1].split("\n## ", 1)[0]
    return next((line for line in section.splitlines() if line.startswith(f"| {env} | default |")), None)


def test_top_level_readme_quotes_the_folders_tables(tmp_dir):
    rows = top_level_rows()
    assert len(rows) >= 2 and all(quoted for _, _, quoted in rows)
    for script, env, quoted in rows:
        # The folders whose comparison holds a default run of this script and env (a benchmark's, and a tuning
        # study's confirmation of its defaults on other seeds): the quoted figure is one of theirs.
        homes = [f for f in FOLDERS if default_row((RESULTS / f / "comparison.md").read_text(), script, env)]
        assert homes, f"README.md's {script} / {env} row: found in no results folder"
        rows_there = {f: default_row(table_text(f, tmp_dir), script, env) for f in homes}
        assert any(quoted[0] in row for row in rows_there.values()), (
            f"README.md quotes {quoted[0]} for {script} / {env}; the folders have: {rows_there}")


# How a README's table heads the figure column of each re-run variant; the per-seed list is the column after it.
VARIANT_COLUMNS = {"default": "bootstrap on", "no-bootstrap-truncation": "bootstrap off"}


def per_seed_figures(readme, env, variant):
    """The per-seed lists ("a, b, c": seeds 1, 2, 3) in the README's table rows of `env`, in the columns
    that follow a column headed with the variant's label."""
    lists, header = [], []
    lines = normalize(readme).splitlines()
    for line, next_line in zip(lines, lines[1:] + [""]):
        cells = [c.strip() for c in line.split("|")]
        if next_line.startswith("|---"):
            header = cells
        elif line.startswith(f"| {env} |"):
            for i, cell in enumerate(cells):
                items = [x.strip().strip("*") for x in cell.split(",")]
                if (len(items) > 1 and all(re.fullmatch(r"-?\d+\.\d+", x) for x in items)
                        and 0 < i <= len(header) and VARIANT_COLUMNS[variant] in header[i - 1]):
                    lists.append(items)
    return lists


# A folder re-run because its first events were lost: its comparison now comes from rerun/, and each re-run seed
# must still be the figure first published for it (the README's per-seed lists).
RERUNS = [f for f in FOLDERS if (RESULTS / f / "rerun").is_dir()]


@pytest.mark.parametrize("folder", RERUNS)
def test_rerun_seeds_reproduce_the_published_figures(folder):
    """Same code arithmetic, same seed, CPU: a re-run ends on the figure the folder published, to the
    hundredth. Each finished re-run seed must be at its seed's place in a per-seed list of its env and variant."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            runs = compare.find_runs([RESULTS / folder / "rerun"])
    except compare.CompareError as e:
        pytest.fail(f"{folder}/rerun holds no finished run to check: {e}")
    readme = (RESULTS / folder / "README.md").read_text()
    for run in runs:
        figure = compare.fmt(compare.run_return(run.returns))
        assert run.variant in VARIANT_COLUMNS, f"{folder}/rerun: add the column label of variant {run.variant}"
        lists = per_seed_figures(readme, run.env, run.variant)
        assert lists, f"{folder}/README.md has no per-seed list for {run.env} / {run.variant}"
        assert any(len(items) >= run.seed and items[run.seed - 1] == figure for items in lists), (
            f"{folder}/rerun: {run.env} / {run.variant} / seed {run.seed} ended on {figure}; "
            f"{folder}/README.md publishes {lists}")


# Speed figures. benchmarks/throughput.sh prints one line per run, "COMMAND | SPS N | runs/RUN"; each measurement
# folder of throughput/ keeps that output as throughput.txt beside the runs' events. The figures the READMEs
# quote in bold (the throughput page's tables of `ppo_*.py` rows, the index's throughput row and the top-level
# README's speed paragraph) are the newest measurement's.
THROUGHPUT = RESULTS / "throughput"
SPS_LINE = re.compile(r"(?P<command>.+) \| SPS (?P<sps>\d+) \| (?P<run>runs/\S+)")
BOLD_INTEGER = re.compile(r"\*\*(\d+)\*\*")


def throughput_measurements():
    """{measurement folder: [(command, SPS, run directory)]}, oldest first (the folders are named by date)."""
    measurements = {}
    for output in sorted(THROUGHPUT.glob("*/throughput.txt")):
        lines = [SPS_LINE.fullmatch(line) for line in output.read_text().splitlines() if line.strip()]
        assert all(lines), f"{output.relative_to(REPO)}: a line is not 'COMMAND | SPS N | runs/RUN'"
        measurements[output.parent] = [(m["command"], int(m["sps"]), output.parent / m["run"]) for m in lines]
    return measurements


def test_throughput_figures_are_read_from_committed_events():
    measurements = throughput_measurements()
    assert measurements, "benchmarks/results/throughput/ holds no measurement with its runs' events"
    for folder, lines in measurements.items():
        for command, sps, run in lines:
            _, sps_events, *_ = compare.load_events(run)
            assert sps_events, f"{run.relative_to(REPO)} holds no charts/SPS events ({command})"
            assert int(sps_events[-1].value) == sps, f"{command}: throughput.txt says {sps}, its events say otherwise"


def bold_integers(text):
    return {int(x) for x in BOLD_INTEGER.findall(normalize(text))}


def test_speed_quotes_are_the_newest_measurement():
    measurements = list(throughput_measurements().values())
    assert measurements, "benchmarks/results/throughput/ holds no measurement with its runs' events"
    newest = {sps for _, sps, _ in measurements[-1]}
    page = current_text((THROUGHPUT / "README.md").read_text())
    quotes = {
        "throughput/README.md's tables": "\n".join(l for l in page.splitlines() if l.startswith("| `ppo_")),
        "benchmarks/results/README.md's throughput row": "\n".join(
            l for l in (RESULTS / "README.md").read_text().splitlines() if l.startswith("| [throughput/]")),
        "README.md's speed paragraph (the one that starts 'Speed on')": "\n\n".join(
            p for p in (REPO / "README.md").read_text().split("\n\n") if p.startswith("Speed on")),
    }
    for where, text in quotes.items():
        assert text, f"{where} is missing"
        assert bold_integers(text) == newest, (
            f"{where} quotes {sorted(bold_integers(text))} in bold; the newest measurement is {sorted(newest)}")


def test_table1_is_recomputed_from_the_committed_events(tmp_path):
    """table1/table1.md is what the command in its README computes from the committed events."""
    spec = importlib.util.spec_from_file_location("table1", REPO / "benchmarks" / "table1.py")
    table1 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table1)
    folder = RESULTS / "table1"
    (command,) = [line.strip() for line in (folder / "README.md").read_text().splitlines()
                  if line.strip().startswith("python benchmarks/table1.py")]
    args = shlex.split(command)[2:]
    i = args.index("--out")
    args[i + 1] = str(tmp_path / "table1.md")
    with contextlib.chdir(REPO), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert table1.main(args) == 0
    assert (tmp_path / "table1.md").read_text() == (folder / "table1.md").read_text()
    # The README quotes the random policy's figures that the table normalises with.
    assert "| HalfCheetah-v5 | -282.49 | " in (folder / "table1.md").read_text()
    # The index's row quotes the table's scores and run counts as they are now.
    (row,) = [line for line in (RESULTS / "README.md").read_text().splitlines() if line.startswith("| [table1/]")]
    quoted = re.findall(r"(?<![\d.])\d+\.\d+(?![\d.])", row)
    assert quoted and all(f" {score} " in (folder / "table1.md").read_text() for score in quoted), row
    for runs in re.findall(r"(\d+ of 21) runs", row):
        assert f"{runs.replace(' of ', ' (of ')})" in (folder / "table1.md").read_text(), row
    # The folder's README counts, per setting, the runs the table has, and lists each of them.
    table = dict(re.findall(r"^\| (.+?) \(`[^`]+`\) \|.*\| (\d+)(?: \(of 21\))? \|$", (folder / "table1.md").read_text(), re.M))
    readme = (folder / "README.md").read_text()
    counted = dict(re.findall(r"^\| (.+?) \| [^|]* \| (?:training: )?(\d+) of 21 finished \|$", readme, re.M))
    assert counted and all(table[label] == n for label, n in counted.items()), counted
    for label, n in counted.items():
        assert len(re.findall(rf"^\| \S+-v5 \| {re.escape(label)} \| [123] \| ", readme, re.M)) == int(n), label


def same_values(*args):
    """benchmarks/same_values.py ARGS -> (exit status, stdout)."""
    spec = importlib.util.spec_from_file_location("same_values", REPO / "benchmarks" / "same_values.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = module.main([*map(str, args)])
    return status, out.getvalue()


def the_run(folder):
    """The one TensorBoard run folder of a run kept under benchmarks/results/."""
    (run_dir,) = (RESULTS / folder).glob("**/runs/*/")
    return run_dir


@pytest.mark.parametrize("a, b, same", [  # same: True, or the loss that differs at the first update
    ("atari_10m/lost_run_1", "same_seed/one_process", True),  # one process, two machines with AVX-512
    ("same_seed/one_process", "same_seed/one_process_avx2", "value_loss"),  # one machine, oneDNN held to AVX2
    ("atari_10m/lost_run_3", "same_seed/torchrun", "value_loss"),  # an AVX2-only CPU against AVX-512
    ("atari_10m/lost_run_3", "same_seed/torchrun_avx2", True),  # ... with oneDNN held to AVX2
    ("same_seed/continuous_default", "same_seed/continuous_onednn_avx2", True),
    ("same_seed/continuous_default", "same_seed/continuous_onednn_sse41", True),
    ("same_seed/continuous_default", "same_seed/continuous_mkl_avx2", True),
    ("same_seed/continuous_default", "same_seed/continuous_mkl_sse4_2", True),
    # intel_xeon/: another CPU model, an Intel Xeon, against the AMD EPYC and itself
    ("same_seed/intel_xeon/one_process", "same_seed/one_process", "policy_loss"),
    ("same_seed/intel_xeon/one_process_avx2", "same_seed/one_process_avx2", "policy_loss"),  # oneDNN held to AVX2 on both
    ("same_seed/intel_xeon/one_process_avx2", "same_seed/intel_xeon/one_process", "policy_loss"),  # the cap changes values here
    ("same_seed/intel_xeon/one_process_avx2_mkl_aten", "same_seed/intel_xeon/one_process_avx2", True),  # no change
    ("same_seed/intel_xeon/one_process_avx2_cbwr", "same_seed/intel_xeon/one_process_avx2", True),  # nor MKL_CBWR
    ("same_seed/intel_xeon/one_process_avx2_mkl_aten", "same_seed/one_process_avx2", "policy_loss"),  # all: not AMD's
    ("same_seed/intel_xeon/torchrun", "same_seed/torchrun", "policy_loss"),
    ("same_seed/intel_xeon/torchrun_avx2", "same_seed/torchrun_avx2", "policy_loss"),
    ("same_seed/intel_xeon/torchrun_avx512_core_bf16", "same_seed/torchrun", "policy_loss"),  # AMD's oneDNN level
    ("same_seed/intel_xeon/continuous_aten_avx2", "same_seed/intel_xeon/continuous_default", True),
    ("same_seed/intel_xeon/continuous_default", "same_seed/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_aten_avx2", "same_seed/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_aten_default", "same_seed/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_avx2", "same_seed/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_avx2_aten_avx2", "same_seed/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_cbwr_avx2", "same_seed/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_cbwr_avx2_strict", "same_seed/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_cbwr_compatible", "same_seed/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_sse4_2", "same_seed/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_aten_default", "same_seed/intel_xeon/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_avx2", "same_seed/intel_xeon/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_avx2_aten_avx2", "same_seed/intel_xeon/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_cbwr_avx2", "same_seed/intel_xeon/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_cbwr_avx2_strict", "same_seed/intel_xeon/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_cbwr_compatible", "same_seed/intel_xeon/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_mkl_sse4_2", "same_seed/intel_xeon/continuous_default", "policy_loss"),
    ("same_seed/intel_xeon/continuous_onednn_avx2", "same_seed/intel_xeon/continuous_default", True),
    ("same_seed/intel_xeon/continuous_onednn_sse41", "same_seed/intel_xeon/continuous_default", True),
    ("same_seed/intel_xeon/discrete_onednn_avx2", "same_seed/intel_xeon/discrete_default", True),
    ("same_seed/intel_xeon/discrete_onednn_sse41", "same_seed/intel_xeon/discrete_default", True),
    ("same_seed/intel_xeon/discrete_aten_avx2", "same_seed/intel_xeon/discrete_default", True),
    ("same_seed/intel_xeon/discrete_mkl_avx2", "same_seed/intel_xeon/discrete_default", "policy_loss"),
    ("same_seed/intel_xeon/discrete_mkl_sse4_2", "same_seed/intel_xeon/discrete_default", "policy_loss"),
    ("same_seed/intel_xeon/discrete_mkl_cbwr_compatible", "same_seed/intel_xeon/discrete_default", "policy_loss"),
    ("same_seed/intel_xeon/discrete_aten_default", "same_seed/intel_xeon/discrete_default", "policy_loss"),
])
def test_same_seed_values_across_cpu_instruction_sets(a, b, same):
    """same_seed/README.md's comparisons, recomputed from the committed events: the values agree, or the first
    update already differs; the README quotes what same_values.py says. The Atari runs here are shorter than
    the ones they are compared with (--prefix); the MLP runs (continuous_, discrete_) are whole."""
    prefix = [] if "/continuous_" in a or "/discrete_" in a else ["--prefix"]
    status, out = same_values(*prefix, the_run(a), the_run(b))
    readme = (RESULTS / "same_seed" / "README.md").read_text()
    if same is True:
        assert status == 0, out
        assert f"same values: {out.split('same values: ')[1].split(' (')[0]}" in readme, out  # as the README says
    else:
        assert status == 1 and re.search(rf"^losses/{same}: \d+ and \d+ points, first difference at point 0$",
                                         out, re.M), out  # the first update already differs


_monitor_spec = importlib.util.spec_from_file_location("monitor_milestones",
                                                       REPO / "benchmarks" / "monitor_milestones.py")
monitor_milestones = importlib.util.module_from_spec(_monitor_spec)
_monitor_spec.loader.exec_module(monitor_milestones)


@pytest.mark.parametrize("game", ["Breakout", "Pong"])
def test_sb3_zoo_milestones_are_recomputed_from_its_monitor_files(game):
    """atari_10m/README.md's row for the SB3 zoo's run of each game: monitor_milestones.py, run again by the
    README's command on the committed Monitor files, prints the same steps and the same last-100 score."""
    raw = (RESULTS / "atari_10m" / "README.md").read_text()
    readme = normalize(raw)  # its minus signs as the script prints them (not the command: its commas stay)
    (command,) = [line for line in raw.splitlines()
                  if line.startswith("python benchmarks/monitor_milestones.py") and f"/{game}NoFrameskip" in line]
    out = io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(out):
        assert monitor_milestones.main(shlex.split(command)[2:]) == 0
    printed = out.getvalue()
    steps = re.findall(r"^-?[\d.]+: (\S+) steps$", printed, re.M)
    (last,) = re.findall(r"^last 100 games: (-?\d+\.\d+)$", printed, re.M)
    lines = readme.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith(f"| {game} |")]
    header, row = lines[at], lines[at + 2]  # the zoo's row comes first, under the header's |---| line
    assert row.startswith("| SB3 zoo PPO"), row
    assert [c.strip() for c in header.split("|")[2:-2]] == re.findall(r"^(-?[\d.]+):", printed, re.M)
    assert [c.strip() for c in row.split("|")[2:-1]] == [*steps, last], printed


# The runs of atari_10m/README.md with a progress table: (its title there, game, seed, the column beside ours:
# its header's end and the run it reads, by title, or None).
PROGRESS_TABLES = [
    ("the first Pong start", "Pong", 1, None),
    ("the second Pong start", "Pong", 1, ("first Pong start", "the first Pong start")),
    ("Breakout seed 2", "Breakout", 2, ("first attempt, seed 1", "the first attempt")),
    ("Pong seed 2", "Pong", 2, ("second Pong start", "the second Pong start")),
    ("Pong seed 3", "Pong", 3, ("Pong seed 2", "Pong seed 2")),
    ("Breakout seed 1", "Breakout", 1, ("Breakout seed 2", "Breakout seed 2")),
    ("Pong seed 1, the seventh start", "Pong", 1, ("fifth start", "Pong seed 1, the fifth start")),
    ("Breakout seed 3, the seventh Breakout start", "Breakout", 3, ("Breakout seed 2", "Breakout seed 2")),
    ("Breakout seed 3, the eighth Breakout start", "Breakout", 3, ("Breakout seed 2", "Breakout seed 2")),
    ("Breakout seed 1, the tenth Breakout start", "Breakout", 1, ("Breakout seed 2", "Breakout seed 2")),
    ("Breakout seed 3, the eleventh Breakout start", "Breakout", 3,
     ("eighth start", "Breakout seed 3, the eighth Breakout start")),
]
# Runs without such a table: their folder, game and seed.
OTHER_RUNS = {"the first attempt": ("lost_run_1", "Breakout", 1), "the fourth start": ("lost_run_4", "Breakout", 1),
              "Pong seed 1, the fifth start": ("lost_run_9", "Pong", 1),
              "Pong seed 2, the sixth start": ("lost_run_10", "Pong", 2),
              "Breakout seed 3, the ninth Breakout start": ("breakout_seed3_ninth", "Breakout", 3)}


def run_of(title):
    """(folder of atari_10m/, game, seed) of the run with that title: for a run with a progress table, the folder
    its README's table names (`sweeps/` while it trains; `lost_run_N/` once its checkpoint is lost)."""
    if title in OTHER_RUNS:
        return OTHER_RUNS[title]
    readme = (RESULTS / "atari_10m" / "README.md").read_text()
    (folder,) = re.findall(rf"Progress of {title} \(from its `log\.txt` and events in `([\w.-]+)/`", readme)
    (game, seed), = [(g, n) for t, g, n, _ in PROGRESS_TABLES if t == title]
    return folder, game, seed


def atari_10m_run(folder, game, seed):
    """The scalars of atari_10m/FOLDER's run of GAME and SEED, from its committed events, and the last step it
    logged anything at."""
    from conftest import read_scalars

    (run_dir,) = (RESULTS / "atari_10m" / folder).glob(f"ppo_atari/default/{game}NoFrameskip-v4/seed{seed}/runs/*/")
    scalars = read_scalars(run_dir)
    return scalars, max(step for points in scalars.values() for step, _ in points)


def games_of(title):
    """(step, score) of every whole game of the titled run, in the order they ended, and its last step."""
    scalars, last_step = atari_10m_run(*run_of(title))
    return sorted(scalars["charts/episodic_return"], key=lambda game: game[0]), last_step


def table_under(lines, header):
    """The rows of the table whose header line starts with `header`, to the blank line that ends it."""
    (at,) = [i for i, line in enumerate(lines) if line.startswith(header)]
    return list(itertools.takewhile(str.strip, lines[at + 2:]))  # under the header and its |---| line


def summary_of(comparison, game):
    """(seeds, figure, steps) of GAME's row in a comparison's summary table: (1, "20.67", "9.687M") for one seed,
    (2, "413.95 ± 20.67", ...) for two (the mean over seeds)."""
    (row,) = [line for line in table_under(comparison.splitlines(), "| env | variant | seeds | ")
              if line.startswith(f"| {game}NoFrameskip-v4 | default | ")]
    cells = [c.strip() for c in row.split("|")]
    return int(cells[3]), cells[4].removesuffix(" (1 seed)"), cells[6]


def one_seed_summary(comparison, game):
    """(figure, steps) of GAME's row in a comparison's summary table of one seed: "20.67", "9.687M"."""
    seeds, figure, steps = summary_of(comparison, game)
    assert seeds == 1, (game, seeds)
    return figure, steps


def per_seed_returns(comparison, game):
    """{seed: figure} of GAME in a comparison's table of each seed's return, for the seeds it has."""
    lines = comparison.splitlines()
    (header,) = [line for line in lines if re.match(r"\| env \| variant \| seed \d", line)]
    (row,) = [line for line in table_under(lines, header) if line.startswith(f"| {game}NoFrameskip-v4 | default | ")]
    seeds = [int(c.strip().removeprefix("seed ")) for c in header.split("|")[3:-1]]
    return {seed: cell.strip() for seed, cell in zip(seeds, row.split("|")[3:-1]) if cell.strip()}


def training_times(game):
    """{seed: training time as compare.py writes it} of GAME's runs in atari_10m/'s comparison, each its own (the
    comparison's wall time column is the mean over seeds)."""
    logdirs = itertools.takewhile(lambda arg: not arg.startswith("-"), compare_command("atari_10m"))
    with contextlib.redirect_stderr(io.StringIO()):
        runs = compare.find_runs([REPO / d for d in logdirs], envs=[f"{game}NoFrameskip-v4"])
    return {run.seed: compare.fmt_time(run.wall_time) for run in runs}


def millions(step):
    """A step count as compare.py writes it: 9687040 -> "9.687M"."""
    return f"{step / 1e6:.3f}".rstrip("0") + "M"


def last_100_at(games, step):
    """The mean of the last 100 games that ended by `step`, as the README writes it (one decimal)."""
    last_100 = [value for game_step, value in games if game_step <= step][-100:]
    assert len(last_100) == 100, step
    return f"{sum(last_100) / 100:.1f}"


@pytest.mark.parametrize("title, game, seed, beside", PROGRESS_TABLES)
def test_progress_rows_are_recomputed_from_the_events_and_the_sb3_zoo(title, game, seed, beside):
    """Each row of atari_10m/README.md's progress table of each run: our scores (the mean of the last 100 games
    that ended by each step it quotes, from the run's committed events in the folder the table names), the SB3
    zoo's at the same steps, as monitor_milestones.py --at computes it from the committed Monitor files, and,
    where the table has that column, another run's at the same steps from its events ("none" past its end)."""
    readme = normalize((RESULTS / "atari_10m" / "README.md").read_text())
    table = readme[readme.index(f"Progress of {title} ("):].split("\n\n")[1]
    header, rows = table.splitlines()[0], table.splitlines()[2:]  # rows: under the header and its |---| line
    assert rows
    assert header.rstrip(" |").endswith(beside[0]) if beside else header.rstrip(" |").endswith("at those steps")
    games, _ = games_of(title)
    for row in rows:
        cells = [c.strip() for c in row.split("|")]
        ours, theirs = cells[3:5]
        quoted = re.findall(r"(-?\d+\.\d) at ([\d.]+[kM]?)(?:;|$)", ours)
        steps = [float(s[:-1]) * 1e3 if s.endswith("k") else float(s[:-1]) * 1e6 if s.endswith("M") else float(s)
                 for _, s in quoted]
        assert steps and len(quoted) == len(ours.split("; ")), row
        for (score, _), step in zip(quoted, steps):
            assert last_100_at(games, step) == score, (row, step)
        if beside:
            other, other_end = games_of(beside[1])
            expected = [last_100_at(other, s) if s <= other_end else "none" for s in steps]
            assert cells[5].split("; ") == expected, row
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert monitor_milestones.main([str(RESULTS / "atari_10m" / "sb3_zoo" / f"{game}NoFrameskip-v4"),
                                            "--at", ",".join(f"{s:.0f}" for s in steps)]) == 0
        assert theirs.split("; ") == re.findall(r"^at \S+: (-?\d+\.\d+)$", out.getvalue(), re.M), row


@pytest.mark.parametrize("title, milestones, row", [
    ("the first attempt", "50,100,150,200,300", "ours, the first attempt"),
    ("the fourth start", "50,100,150,200,300", "ours, the fourth start"),
    ("the first Pong start", "-15,0,15,20", "ours, the first Pong start"),
    ("the second Pong start", "-15,0,15,20", "ours, the second Pong start"),
    ("Breakout seed 2", "50,100,150,200,300,400", "ours, Breakout seed 2"),
    ("Pong seed 2", "-15,0,15,20", "ours, Pong seed 2"),
    ("Pong seed 3", "-15,0,15,20", "ours, Pong seed 3"),
    ("Pong seed 1, the fifth start", "-15,0,15,20", "ours, Pong seed 1, the fifth start"),
    ("Pong seed 2, the sixth start", "-15,0,15,20", "ours, Pong seed 2, the sixth start"),
    ("Breakout seed 1", "50,100,150,200,300,400", "ours, Breakout seed 1, the sixth Breakout start"),
    ("Pong seed 1, the seventh start", "-15,0,15,20", "ours, Pong seed 1, the seventh start"),
    ("Breakout seed 3, the seventh Breakout start", "50,100,150,200,300,400",
     "ours, Breakout seed 3, the seventh Breakout start"),
    ("Breakout seed 3, the eighth Breakout start", "50,100,150,200,300,400",
     "ours, Breakout seed 3, the eighth Breakout start"),
    ("Breakout seed 1, the tenth Breakout start", "50,100,150,200,300,400",
     "ours, Breakout seed 1, the tenth Breakout start"),
])
def test_milestone_rows_of_our_partial_runs(title, milestones, row, tmp_path):
    """atari_10m/README.md's milestone rows for our partial runs: compare.py --milestones, run on the committed
    events, first reaches each score where the row says; of those it has not reached, a finished run's row says
    "not reached", a lost run's says "not by" its last logged step for the first and leaves the rest blank, a
    training run's says "not yet" or blank. Where the row's "last 100 games" column is filled, it is compare.py's
    figure for the run: as is for a finished run, "FIGURE at STEPS" (where it ended) for one that did not finish."""
    folder, game, seed = run_of(title)
    out = io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(out):
        assert compare.main([f"benchmarks/results/atari_10m/{folder}", "--include-unfinished", "--no-plots",
                             f"--milestones={milestones}", "--out", str(tmp_path)]) == 0
    (computed,) = [line for line in out.getvalue().splitlines()
                   if line.startswith(f"| {game}NoFrameskip-v4 | default | {seed} | ") and "(1 seed)" not in line]
    computed = [c.strip().split(" (")[0] for c in computed.split("|")[4:-1]]
    readme = (RESULTS / "atari_10m" / "README.md").read_text()
    (quoted_row,) = [line for line in readme.splitlines() if line.startswith(f"| {row} (")]
    n = len(milestones.split(","))
    quoted = [c.strip() for c in quoted_row.split("|")[2:2 + n]]
    last_100 = [c.strip() for c in quoted_row.split("|")[2 + n:-1]]
    assert len(computed) == len(quoted) == n, (computed, quoted)
    reached = [ours for ours in computed if ours != "not reached"]
    assert quoted[:len(reached)] == reached, (computed, quoted)  # scores are reached in order: a prefix
    unreached = quoted[len(reached):]
    finished = (RESULTS / "atari_10m" / folder / f"ppo_atari/default/{game}NoFrameskip-v4/seed{seed}/done").exists()
    if last_100 and last_100[0]:
        figure, steps = one_seed_summary(out.getvalue(), game)
        assert last_100[0] == (figure if finished else f"{figure} at {steps}"), last_100
    if finished:  # what it never reached, in compare.py's words
        assert unreached == ["not reached"] * len(unreached), quoted
    elif folder == "sweeps":  # still training
        assert all(theirs in ("", "not yet") for theirs in unreached), quoted
    elif unreached:  # a lost run: the first it never reached is "not by" its last logged step, the rest blank
        _, end = atari_10m_run(folder, game, seed)
        assert unreached == [f"not by {millions(end)}"] + [""] * (len(unreached) - 1), quoted


def test_atari_10m_summary_tables_are_the_comparisons(tmp_dir):
    """The summary table at the top of atari_10m/README.md for each finished game ("| Breakout, the mean of 100
    consecutive games | ..."): its rows "ours, seed N: first at step" and "ours, seed N: training time by then"
    are that run's row of the regenerated milestone table (step, and the time in brackets), and their last
    column the seed's last-100 figure in the regenerated table of each seed's return and its own training time;
    the SB3 zoo's row under them is its row in the README's milestone table of that game."""
    readme = normalize((RESULTS / "atari_10m" / "README.md").read_text()).splitlines()
    comparison = normalize(regenerate("atari_10m", tmp_dir)).splitlines()
    headers = [i for i, line in enumerate(readme) if ", the mean of 100 consecutive games |" in line]
    assert headers, "atari_10m/README.md has no summary table"
    for at in headers:
        game = readme[at].split(",")[0].strip("| ")
        scores = [c.strip() for c in readme[at].split("|")[2:-2]]
        rows = {}
        for line in readme[at + 2:]:
            if not line.startswith("| ours, seed "):
                break
            label, *cells = [c.strip() for c in line.split("|")[1:-1]]
            rows[label] = cells
        assert rows, readme[at]
        seeds = {int(label.split(":")[0].split()[-1]) for label in rows}
        returns, times = per_seed_returns("\n".join(comparison), game), training_times(game)
        assert seeds == set(returns) == set(times), (game, seeds, returns, times)
        for seed in seeds:
            (table_header,) = [i for i, line in enumerate(comparison) if line.startswith("| env | variant | seed | ")
                               and any(row.startswith(f"| {game}NoFrameskip-v4 | default | {seed} | ")
                                       for row in table_under(comparison, line))]
            assert [c.strip() for c in comparison[table_header].split("|")[4:-1]] == scores, comparison[table_header]
            (hits,) = [row for row in table_under(comparison, comparison[table_header])
                       if row.startswith(f"| {game}NoFrameskip-v4 | default | {seed} | ")]
            hits = [c.strip() for c in hits.split("|")[4:-1]]
            assert rows[f"ours, seed {seed}: first at step"] == [h.split(" (")[0] for h in hits] + [returns[seed]]
            assert rows[f"ours, seed {seed}: training time by then"] == \
                [h.split(" (")[1].rstrip(")") if "(" in h else h for h in hits] + [times[seed]]
        # The zoo's row under ours: the cells of its row in the milestone table of each game (held to its Monitor
        # files by test_sb3_zoo_milestones_are_recomputed_from_its_monitor_files).
        zoo = [c.strip() for c in readme[at + 2 + len(rows)].split("|")[1:-1]]
        (milestones,) = [i for i, line in enumerate(readme) if line.startswith(f"| {game} |")]
        assert zoo[0] == "SB3 zoo PPO (1 run): first at step", zoo
        assert zoo[1:] == [c.strip() for c in readme[milestones + 2].split("|")[2:-1]], zoo


def test_atari_10m_headlines_are_the_comparison(tmp_dir):
    """The bold headline of each game at the top of atari_10m/README.md ("**Pong, seed 3, at 9,687,040 steps:
    20.67**", "**Breakout, seeds 1 and 2, at 10M steps: 413.95 ± 20.67**") is that game's row of the regenerated
    comparison: its figure (mean ± std over seeds, or one seed's), the step it ended at ("10M" for runs that
    trained their whole 9,999,360 steps), its number of seeds, and which seeds have a return in the table of each
    seed's."""
    readme = normalize((RESULTS / "atari_10m" / "README.md").read_text())
    headlines = re.findall(r"^\*\*(\w+), seeds? (\d+(?:, \d+)*(?: and \d+)?), at (10M|\d+) steps: "
                           r"(-?\d+\.\d+(?: ± \d+\.\d+)?)\*\*", readme, re.M)
    assert {game for game, *_ in headlines} == {"Breakout", "Pong"}, headlines
    comparison = regenerate("atari_10m", tmp_dir)
    for game, seeds, steps, figure in headlines:
        seeds = {int(seed) for seed in re.findall(r"\d+", seeds)}
        assert summary_of(comparison, game) == \
            (len(seeds), figure, "9.999M" if steps == "10M" else millions(int(steps))), (game, figure, steps)
        assert set(per_seed_returns(comparison, game)) == seeds, (game, seeds)


# Replays that atari_10m/README.md reports: (the later run, the earlier run of its seed that it replays), by title.
REPLAYS = [
    ("Pong seed 2, the sixth start", "Pong seed 2"),  # both on the AMD EPYC with AVX-512
    ("Pong seed 1, the seventh start", "Pong seed 1, the fifth start"),  # AMD EPYCs with AVX2 only, two models
    ("Breakout seed 3, the ninth Breakout start", "Breakout seed 3, the eighth Breakout start"),  # AVX-512, two families
    ("Breakout seed 1, the tenth Breakout start", "the fourth start"),  # AMD EPYCs with AVX-512
    ("Breakout seed 3, the eleventh Breakout start", "Breakout seed 3, the eighth Breakout start"),  # AVX-512, two families
]


def first_stop(folder, game, seed):
    """The step at which the run in atari_10m/FOLDER was first stopped with a checkpoint, by its log, or None."""
    log = RESULTS / "atari_10m" / folder / f"ppo_atari/default/{game}NoFrameskip-v4/seed{seed}/log.txt"
    stop = re.search(r"^ppo_atari: stopped by \w+ at step (\d+);", log.read_text(), re.M)
    return int(stop[1]) if stop else None


@pytest.mark.parametrize("replay, first", REPLAYS)
def test_replays_log_the_first_run_bit_for_bit_up_to_its_first_resume(replay, first):
    """atari_10m/README.md says these runs replay an earlier run of their seed bit for bit up to where the earlier
    one was first stopped and resumed: at every step both runs logged up to there, every scalar but the wall-clock
    speed holds the same value, and they share at least one logged game and one update. A resume starts fresh
    games, so where both went past it, the first update after it differs."""
    stop = first_stop(*run_of(first))
    (replay, replay_end), (first, first_end) = (atari_10m_run(*run_of(title)) for title in (replay, first))
    end = min(replay_end, first_end, stop or first_end)
    assert set(replay) == set(first)
    for tag in set(replay) - {"charts/SPS"}:
        ours, theirs = ([point for point in run[tag] if point[0] <= end] for run in (replay, first))
        assert ours and ours == theirs, tag
    if stop and min(replay_end, first_end) > stop:
        ours, theirs = (next(point for point in run["losses/value_loss"] if point[0] > stop)
                        for run in (replay, first))
        assert ours[0] == theirs[0] and ours[1] != theirs[1], (ours, theirs)
