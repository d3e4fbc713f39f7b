#!/usr/bin/env python3
"""Side-by-side benchmark: ralph-flow against LangGraph, on one machine, interleaved.

    python3 benches/side_by_side/run.py --ralph-flow target/release/ralph-flow \
        [--ralph-flow-b OTHER_BINARY --label-b before] [--reps 7] [--quick] [--out results.md]

Python 3.11 standard library only. LangGraph runs in a virtualenv this script makes
(target/side-by-side-venv, reused when it already has LangGraph), with `langgraph` and
`langgraph-checkpoint-sqlite` from PyPI; its side is langgraph_bench.py.

Scenarios (see README.md for the exact workflows):
  chain    a chain of N no-op agent stages, each needing the previous (replayed answers);
           LangGraph: a StateGraph chain of N nodes
  loop     a loop of 500 iterations x 2 body stages; LangGraph: a 2-node cycle
  fanout   a for_each over 1,000 items, max_concurrency 64, one agent stage in the body;
           LangGraph: the Send API fanning out 1,000 times, max_concurrency 64
  command  a chain of 1,000 `/bin/true` command stages (ralph-flow only), with two floors
           measured the same way: spawn-and-wait of /bin/true from a Python loop
  resume   a run with N settled stages waiting on a gate (approved), then `ralph-flow resume`
           timed while it finishes the gate and one last agent stage

Configurations: ralph-flow with synchronous=NORMAL (the default) and FULL (`--full-sync`);
LangGraph with a SqliteSaver in WAL mode with synchronous=NORMAL and FULL, durability="sync";
optionally a second ralph-flow binary (B) at NORMAL and FULL.

Method. Every measurement is the wall time of a whole process (spawn to exit, reaped with
os.wait4; its max RSS as GNU time reports it, which leaves out the pages of this Python
process), for ralph-flow and for LangGraph alike: interpreter
start, imports and graph compilation are in LangGraph's numbers as parsing, checking and
opening the store are in ralph-flow's, and both are cancelled by the baseline. The cost per
stage is (T(N) - T(base)) / (stages(N) - stages(base)), where the baseline is the smallest
run of the same shape (a 1-stage chain, a 1-iteration loop, a 1-item fan-out), measured in
the same repetition just before; the table gives the median over the repetitions. Within
each repetition every configuration runs once, in turn, so drifts of the machine hit them
all alike. Every ralph-flow run is checked: exit code, and through `ralph-flow status --json`
that every stage it should have settled is done; LangGraph's side checks its final state.
A wrong result stops the benchmark.

Run directories live under target/side-by-side-runs (on the disk, not tmpfs). They are kept
until the end of the whole benchmark, because deleting many thousands of files makes this
kind of disk (ext4 with `discard`) slow for a while; pass --keep to keep them.
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LANGGRAPH_PACKAGES = ["langgraph", "langgraph-checkpoint-sqlite"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fail(msg: str) -> None:
    raise SystemExit(f"side-by-side: {msg}")


# --- processes ---------------------------------------------------------------------------


@dataclass
class Proc:
    seconds: float
    code: int
    rss_kb: int
    stdout: str
    stderr: str


# The max RSS of a process Python starts counts Python's own pages: the child is made with
# vfork (or fork) and its high-water mark survives the exec. GNU time starts the measured
# program from its own small process and reports that program's max RSS alone.
GNU_TIME = "/usr/bin/time" if Path("/usr/bin/time").exists() else None


def run_timed(argv: list, cwd: Path, tag: str) -> Proc:
    """Runs a process to its end: wall time from spawn to reaping, exit code, max RSS."""
    out, err = cwd / f"{tag}.stdout", cwd / f"{tag}.stderr"
    rss_file = cwd / f"{tag}.rss"
    if GNU_TIME:
        argv = [GNU_TIME, "-q", "-f", "%M", "-o", str(rss_file), *argv]
    with open(out, "wb") as fo, open(err, "wb") as fe:
        t = time.perf_counter()
        p = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe)
        try:
            _, status, usage = os.wait4(p.pid, 0)
        except BaseException:
            # Stopped by a signal (see main): stop the child too.
            p.kill()
            p.wait()
            raise
        seconds = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    rss_kb = usage.ru_maxrss
    if GNU_TIME:
        try:
            rss_kb = int(rss_file.read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            pass
    return Proc(seconds, p.returncode, rss_kb, out.read_text(), err.read_text())


def check_code(proc: Proc, want: int, what: str) -> None:
    if proc.code != want:
        fail(
            f"{what}: exit code {proc.code}, expected {want}\n"
            f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
        )


# --- ralph-flow workflows and recordings -------------------------------------------------


def reply(scope: str, stage: str, prompt: str, text: str) -> str:
    """One answer of a recording (the format `--record` writes), with the prompt's hash so
    that the replay does not warn about a changed prompt."""
    return json.dumps(
        {
            "scope": scope,
            "stage": stage,
            "attempt": 1,
            "agent": "bot",
            "prompt_bytes": len(prompt.encode()),
            "prompt_sha256": hashlib.sha256(prompt.encode()).hexdigest(),
            "reply": {
                "text": text,
                "raw": text,
                "usage": {"input_tokens": 10, "output_tokens": 2, "cached_tokens": 0, "cost_usd": None},
                "session_id": None,
                "model": None,
            },
        },
        separators=(",", ":"),
    )


HEADER = 'name = "bench"\n\n[agents.bot]\nkind = "claude"\n'


@dataclass
class Workflow:
    toml: str
    recording: list  # lines
    workers: set  # the names of the agent or command stages
    settled: int  # how many of them must be done at the end


def chain_workflow(n: int, kind: str = "agent") -> Workflow:
    """N stages s0..s{N-1}, each needing the one before: agent stages (answered by the
    replay) or `/bin/true` command stages."""
    parts, rec = [HEADER], []
    for i in range(n):
        parts.append(f"\n[stages.s{i}]\n")
        if kind == "agent":
            parts.append(f'kind = "agent"\nagent = "bot"\nprompt = "step {i}"\n')
            rec.append(reply("", f"s{i}", f"step {i}", f"ok {i}"))
        else:
            parts.append('kind = "command"\nargv = ["/bin/true"]\n')
        if i > 0:
            parts.append(f'needs = ["s{i - 1}"]\n')
    return Workflow("".join(parts), rec, {f"s{i}" for i in range(n)}, n)


def loop_workflow(iterations: int) -> Workflow:
    """A loop of exactly `iterations` iterations of two agent stages (b needs a). `until`
    holds after the last one, so the loop ends successfully (outcome "until", exit 0);
    replay scopes are `l#1`, `l#2`, ... (1-based)."""
    toml = HEADER + (
        f'\n[stages.l]\nkind = "loop"\nmax_iterations = {iterations}\n'
        f'until = "iteration >= {iterations}"\n'
        '\n[stages.l.stages.a]\nkind = "agent"\nagent = "bot"\nprompt = "a"\n'
        '\n[stages.l.stages.b]\nkind = "agent"\nagent = "bot"\nprompt = "b"\nneeds = ["a"]\n'
    )
    rec = []
    for k in range(1, iterations + 1):
        rec.append(reply(f"l#{k}", "a", "a", "ok"))
        rec.append(reply(f"l#{k}", "b", "b", "ok"))
    return Workflow(toml, rec, {"a", "b"}, 2 * iterations)


def fanout_workflow(n: int) -> Workflow:
    """A for_each over a list param of n items ("0", "1", ...), at most 64 at once, one
    agent stage in the body; replay scopes are `f#0`, `f#1`, ... (the item's index, the
    default key)."""
    items = json.dumps([str(i) for i in range(n)])
    toml = (
        'name = "bench"\n\n[params.items]\ntype = "list"\n'
        f"default = {items}\n\n[agents.bot]\nkind = \"claude\"\n"
        '\n[stages.f]\nkind = "for_each"\nover = "params.items"\nmax_concurrency = 64\n'
        '\n[stages.f.stages.w]\nkind = "agent"\nagent = "bot"\nprompt = "work {{ item }}"\n'
    )
    rec = [reply(f"f#{i}", "w", f"work {i}", "ok") for i in range(n)]
    return Workflow(toml, rec, {"w"}, n)


def gated_workflow(n: int) -> Workflow:
    """N chained agent stages, then a gate `g`, then one agent stage `last`: run with
    --no-wait, it stops on the gate with code 75 and N stages settled."""
    wf = chain_workflow(n)
    toml = wf.toml + (
        f'\n[stages.g]\nkind = "gate"\nneeds = ["s{n - 1}"]\nmessage = "go on?"\n'
        'timeout = "24h"\non_timeout = "reject"\n'
        '\n[stages.last]\nkind = "agent"\nagent = "bot"\nprompt = "last"\nneeds = ["g"]\n'
    )
    rec = wf.recording + [reply("", "last", "last", "done")]
    return Workflow(toml, rec, wf.workers | {"g", "last"}, n + 2)


def write_workflow(d: Path, wf: Workflow) -> None:
    d.mkdir(parents=True)
    (d / "w.toml").write_text(wf.toml)
    (d / "rec.jsonl").write_text("\n".join(wf.recording) + "\n")


def check_settled(binary: str, d: Path, run_id: str, wf: Workflow, what: str) -> None:
    """Every stage of the run is done, and as many of the workers as expected."""
    p = subprocess.run(
        [binary, "status", run_id, "--state-dir", "state", "--json"],
        cwd=d, capture_output=True, text=True,
    )
    if p.returncode != 0:
        fail(f"{what}: `ralph-flow status` failed: {p.stderr}")
    st = json.loads(p.stdout)
    if st.get("status") != "finished" or list(st.get("exit") or []) != ["success", 0]:
        fail(f"{what}: run {run_id} is {st.get('status')} {st.get('exit')}")
    not_done = [n for n in st["nodes"] if n["state"] != "done"]
    if not_done:
        fail(f"{what}: stages not done: {not_done[:3]}")
    done = sum(1 for n in st["nodes"] if n["node"] in wf.workers)
    if done != wf.settled:
        fail(f"{what}: {done} stages done, expected {wf.settled}")


def ralph_flow_run(binary: str, d: Path, wf: Workflow, full: bool, what: str) -> Proc:
    """`ralph-flow run` of a workflow in its own directory, checked."""
    write_workflow(d, wf)
    argv = [binary, "run", "w.toml", "--state-dir", "state", "--progress", "quiet", "--json"]
    if wf.recording:
        argv += ["--replay", "rec.jsonl"]
    if full:
        argv.append("--full-sync")
    p = run_timed(argv, d, "run")
    check_code(p, 0, what)
    run_id = json.loads(p.stdout)["run"]
    check_settled(binary, d, run_id, wf, what)
    return p


# --- the configurations ------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    rss_kb: int
    inner: float | None = None  # LangGraph's in-process invoke time
    store_bytes: int = 0  # the SQLite store at the end (with its WAL)


def store_size(d: Path, name: str) -> int:
    return sum(f.stat().st_size for f in d.glob(name + "*") if f.is_file())


@dataclass
class Config:
    name: str  # column title
    kind: str  # "rf", "lg" or "floor"
    binary: str = ""
    sync: str = "NORMAL"
    group: str = ""  # the RSS column: "rf", "lg" or "B"


class Bench:
    def __init__(self, args, root: Path):
        self.args = args
        self.root = root
        self.counter = 0

    def new_dir(self, label: str) -> Path:
        self.counter += 1
        return self.root / f"{self.counter:05d}-{label}"

    def measure(self, cfg: Config, scenario: str, size: int) -> Sample:
        """One run of a scenario at one size in one configuration."""
        what = f"{scenario} {size} {cfg.name}"
        d = self.new_dir(f"{scenario}-{size}-{cfg.name.replace(' ', '_')}")
        if cfg.kind == "rf":
            wf = {
                "chain": lambda: chain_workflow(size),
                "loop": lambda: loop_workflow(size),
                "fanout": lambda: fanout_workflow(size),
                "command": lambda: chain_workflow(size, "command"),
            }[scenario]()
            p = ralph_flow_run(cfg.binary, d, wf, cfg.sync == "FULL", what)
            return Sample(p.seconds, p.rss_kb, store_bytes=store_size(d / "state", "state.db"))
        if cfg.kind == "lg":
            d.mkdir(parents=True)
            py = str(self.args.venv / "bin" / "python")
            p = run_timed(
                [py, str(HERE / "langgraph_bench.py"), scenario, str(size), cfg.sync, "db.sqlite"],
                d, "langgraph",
            )
            check_code(p, 0, what)
            # LangGraph's checkpoints grow with the graph: the store of a chain of 10,000
            # nodes is about 7 GB. One file, so removing it at once does not slow the disk
            # the way thousands of small files do; keeping them would fill it.
            size = store_size(d, "db.sqlite")
            for f in d.glob("db.sqlite*"):
                f.unlink()
            return Sample(p.seconds, p.rss_kb, json.loads(p.stdout)["seconds"], size)
        if cfg.kind == "floor":
            return Sample(spawn_floor(size, cfg.sync), 0)
        raise AssertionError(cfg.kind)


def spawn_floor(n: int, how: str) -> float:
    """The time of n spawn-and-wait of /bin/true from this process."""
    argv = ["/bin/true"]
    t = time.perf_counter()
    if how == "posix_spawn":
        for _ in range(n):
            pid = os.posix_spawn(argv[0], argv, os.environ)
            _, status = os.waitpid(pid, 0)
            if status != 0:
                fail("/bin/true failed")
    else:
        for _ in range(n):
            subprocess.run(argv, check=True)
    return time.perf_counter() - t


# --- measurements ------------------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    size: str
    cells: dict = field(default_factory=dict)  # config name -> text
    rss: dict = field(default_factory=dict)  # "rf"/"lg"/"B" -> text
    details: list = field(default_factory=list)  # lines of the details table


def fmt_us(x: float) -> str:
    return f"{x * 1e6:.0f}"


def fmt_mb(kb: float) -> str:
    return f"{kb / 1024:.0f} MB"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def per_stage_group(bench, title, scenario, size, stages, base_size, base_stages, configs, reps) -> Row:
    """Runs the baseline and the full size of one scenario in every configuration, `reps`
    times interleaved, and gives the median cost per stage."""
    raw = {c.name: [] for c in configs}  # (base sample, sample) per repetition
    for rep in range(reps):
        for c in configs:
            b = bench.measure(c, scenario, base_size)
            s = bench.measure(c, scenario, size)
            raw[c.name].append((b, s))
            log(
                f"  [{title} {size}] rep {rep + 1}/{reps} {c.name}: "
                f"{s.seconds:.3f} s (base {b.seconds:.3f} s), "
                f"{(s.seconds - b.seconds) / (stages - base_stages) * 1e6:.0f} µs/stage"
                + (f", {fmt_mb(s.rss_kb)}" if s.rss_kb else "")
            )
    row = Row(title, f"{size:,}")
    for c in configs:
        pairs = raw[c.name]
        per = statistics.median((s.seconds - b.seconds) / (stages - base_stages) for b, s in pairs)
        row.cells[c.name] = fmt_us(per)
        t_n = statistics.median(s.seconds for _, s in pairs)
        t_b = statistics.median(b.seconds for b, _ in pairs)
        spread = [fmt_us((s.seconds - b.seconds) / (stages - base_stages)) for b, s in pairs]
        line = (
            f"| {title} | {size:,} | {c.name} | {t_n * 1e3:.1f} ms | {t_b * 1e3:.1f} ms | "
            f"{', '.join(spread)} | "
        )
        if c.kind == "lg":
            inner = statistics.median(s.inner / stages for _, s in pairs)
            line += f"{fmt_us(inner)} µs |"
        else:
            line += " |"
        rss = statistics.median(s.rss_kb for _, s in pairs)
        line += f" {fmt_mb(rss) if rss else ''} |"
        store = statistics.median(s.store_bytes for _, s in pairs)
        line += f" {fmt_bytes(store) if store else ''} |"
        row.details.append(line)
        if rss and c.group:
            row.rss.setdefault(c.group, fmt_mb(rss))
    return row


def resume_group(bench, size: int, configs, reps) -> Row:
    """A run of `size` settled stages stopped on an approved gate, resumed and timed. The
    run is made once per binary; before each timed resume its store is put back as it was
    (the state directory's files copied back, the resume's new artifacts removed)."""
    prepared = {}
    for c in configs:
        if c.group in prepared:
            continue
        d = bench.new_dir(f"resume-{size}-setup")
        wf = gated_workflow(size)
        write_workflow(d, wf)
        what = f"resume {size} setup ({c.binary})"
        p = run_timed(
            [c.binary, "run", "w.toml", "--state-dir", "state", "--progress", "quiet", "--json",
             "--replay", "rec.jsonl", "--no-wait"],
            d, "run",
        )
        check_code(p, 75, what)  # 75: waiting on a gate
        run_id = json.loads(p.stdout)["run"]
        a = run_timed([c.binary, "approve", run_id, "g", "--state-dir", "state"], d, "approve")
        check_code(a, 0, what + " approve")
        state = d / "state"
        snap = d / "snapshot"
        snap.mkdir()
        files = [f for f in state.iterdir() if f.is_file()]
        for f in files:
            shutil.copy2(f, snap / f.name)
        artifacts = {x.name for x in (state / "runs" / run_id).iterdir()}
        prepared[c.group] = (d, wf, run_id, snap, artifacts)
        log(f"  [resume {size}] setup with {c.binary}: {p.seconds:.1f} s, run {run_id}")

    samples = {c.name: [] for c in configs}
    for rep in range(reps):
        for c in configs:
            d, wf, run_id, snap, artifacts = prepared[c.group]
            state = d / "state"
            for f in state.iterdir():
                if f.is_file():
                    f.unlink()
            for f in snap.iterdir():
                shutil.copy2(f, state / f.name)
            for x in (state / "runs" / run_id).iterdir():
                if x.name not in artifacts:
                    shutil.rmtree(x)
            argv = [c.binary, "resume", run_id, "--state-dir", "state", "--progress", "quiet", "--json"]
            if c.sync == "FULL":
                argv.append("--full-sync")
            what = f"resume {size} {c.name}"
            p = run_timed(argv, d, f"resume-{rep}-{c.sync}")
            check_code(p, 0, what)
            check_settled(c.binary, d, run_id, wf, what)
            samples[c.name].append(p)
            log(f"  [resume {size}] rep {rep + 1}/{reps} {c.name}: {p.seconds * 1e3:.1f} ms, {fmt_mb(p.rss_kb)}")
    row = Row("resume (total ms of the process)", f"{size:,}")
    for c in configs:
        ps = samples[c.name]
        t = statistics.median(p.seconds for p in ps)
        rss = statistics.median(p.rss_kb for p in ps)
        row.cells[c.name] = f"{t * 1e3:.0f} ms"
        row.rss.setdefault(c.group, fmt_mb(rss))
        row.details.append(
            f"| resume | {size:,} | {c.name} | {t * 1e3:.1f} ms | | "
            f"{', '.join(f'{p.seconds * 1e3:.0f} ms' for p in ps)} | | {fmt_mb(rss)} | |"
        )
    return row


# --- setup and report --------------------------------------------------------------------


def ensure_venv(venv: Path) -> str:
    """The virtualenv with LangGraph (made and filled when missing); returns the versions."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import langgraph.checkpoint.sqlite, langgraph.graph"]
    if not py.exists() or subprocess.run(probe, capture_output=True).returncode != 0:
        log(f"making the virtualenv {venv} with {' '.join(LANGGRAPH_PACKAGES)}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *LANGGRAPH_PACKAGES], check=True)
        subprocess.run(probe, check=True)
    code = (
        "import importlib.metadata as m, sqlite3, sys; "
        "print(', '.join(f'{p} {m.version(p)}' for p in "
        f"{['langgraph', 'langgraph-checkpoint', *LANGGRAPH_PACKAGES[1:]]!r}) + "
        "f'; Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}')"
    )
    return subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def sh(argv, cwd=None) -> str:
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else "?"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ralph-flow", required=True, help="the ralph-flow binary")
    ap.add_argument("--ralph-flow-b", help="a second binary to compare (e.g. an older build)")
    ap.add_argument("--label-b", default="B", help="the second binary's column label")
    ap.add_argument("--reps", type=int, help="repetitions (default 7; 3 with --quick)")
    ap.add_argument("--reps-large", type=int, default=3,
                    help="repetitions for chains of 5,000 stages or more (default 3)")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    ap.add_argument("--only", help="comma-separated scenarios: chain,loop,fanout,command,resume")
    ap.add_argument("--chain-sizes", help="comma-separated chain lengths instead of the default")
    ap.add_argument("--resume-sizes", help="comma-separated resume sizes instead of the default")
    ap.add_argument("--no-langgraph", action="store_true", help="ralph-flow only")
    ap.add_argument("--langgraph-max-chain", type=int, default=None,
                    help="skip LangGraph on chains longer than this (it is quadratic)")
    ap.add_argument("--venv", type=Path, default=REPO / "target" / "side-by-side-venv")
    ap.add_argument("--work", type=Path, default=REPO / "target" / "side-by-side-runs",
                    help="where run directories go (on the real disk)")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--settle", type=float, default=30,
                    help="seconds to wait before measuring (default 30): file creation on ext4 "
                         "is slow for a while after many files were deleted, e.g. by a previous run")
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    args = ap.parse_args()

    reps = args.reps or (3 if args.quick else 7)
    args.ralph_flow = str(Path(args.ralph_flow).resolve())
    binaries = [args.ralph_flow]
    if args.ralph_flow_b:
        args.ralph_flow_b = str(Path(args.ralph_flow_b).resolve())
        binaries.append(args.ralph_flow_b)
    for b in binaries:
        if not os.access(b, os.X_OK):
            fail(f"{b} is not an executable")
    only = set(args.only.split(",")) if args.only else {"chain", "loop", "fanout", "command", "resume"}
    unknown = only - {"chain", "loop", "fanout", "command", "resume"}
    if unknown:
        fail(f"unknown scenarios: {', '.join(sorted(unknown))}")

    if args.quick:
        chains, iterations, items, commands, resumes = [50, 200], 50, 100, 100, [200]
    else:
        chains, iterations, items, commands, resumes = [250, 1000, 2000, 10000], 500, 1000, 1000, [1000, 4000, 10000]
    if args.chain_sizes:
        chains = [int(x) for x in args.chain_sizes.split(",")]
    if args.resume_sizes:
        resumes = [int(x) for x in args.resume_sizes.split(",")]

    lg_versions = "not run" if args.no_langgraph else ensure_venv(args.venv)
    if args.settle > 0:
        log(f"waiting {args.settle:g} s for the disk to settle")
        os.sync()
        time.sleep(args.settle)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = load()
    root = args.work / started.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True)
    bench = Bench(args, root)

    rf = [Config("ralph-flow NORMAL", "rf", args.ralph_flow, "NORMAL", "rf"),
          Config("ralph-flow FULL", "rf", args.ralph_flow, "FULL", "rf")]
    lg = [] if args.no_langgraph else [Config("LangGraph NORMAL", "lg", sync="NORMAL", group="lg"),
                                       Config("LangGraph FULL", "lg", sync="FULL", group="lg")]
    b = []
    if args.ralph_flow_b:
        b = [Config(f"{args.label_b} NORMAL", "rf", args.ralph_flow_b, "NORMAL", "B"),
             Config(f"{args.label_b} FULL", "rf", args.ralph_flow_b, "FULL", "B")]

    rows = []
    failure = None

    def stop(signum, _frame):
        raise SystemExit(f"stopped by signal {signal.Signals(signum).name}")

    # SIGTERM and Ctrl-C end the benchmark like a wrong result: with a report of what was
    # measured so far.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        if "chain" in only:
            for n in chains:
                cfgs = rf + b
                if args.langgraph_max_chain is None or n <= args.langgraph_max_chain:
                    cfgs = rf + lg + b
                r = args.reps_large if n >= 5000 else reps
                log(f"chain of {n} agent stages, {r} repetitions")
                rows.append(per_stage_group(bench, "chain of no-op agent stages", "chain", n, n, 1, 1, cfgs, r))
        if "loop" in only:
            log(f"loop of {iterations} iterations x 2 stages, {reps} repetitions")
            rows.append(per_stage_group(bench, "loop, 2 stages per iteration", "loop", iterations,
                                        2 * iterations, 1, 2, rf + lg + b, reps))
        if "fanout" in only:
            log(f"for_each over {items} items, {reps} repetitions")
            rows.append(per_stage_group(bench, "fan-out, max_concurrency 64", "fanout", items,
                                        items, 1, 1, rf + lg + b, reps))
        if "command" in only:
            log(f"chain of {commands} /bin/true command stages, {reps} repetitions")
            floors = [Config("floor posix_spawn", "floor", sync="posix_spawn"),
                      Config("floor subprocess", "floor", sync="subprocess")]
            row = per_stage_group(bench, "chain of /bin/true command stages", "command", commands,
                                  commands, 1, 1, rf + b + floors, reps)
            rows.append(row)
            for f, label in [("floor posix_spawn", "floor: os.posix_spawn + waitpid of /bin/true (Python loop)"),
                             ("floor subprocess", "floor: subprocess.run of /bin/true (Python loop)")]:
                fr = Row(label, f"{commands:,}")
                fr.cells["ralph-flow NORMAL"] = row.cells.pop(f)
                rows.append(fr)
        if "resume" in only:
            for n in resumes:
                log(f"resume after {n} settled stages, {reps} repetitions")
                rows.append(resume_group(bench, n, rf + b, reps))
    except SystemExit as e:
        # A wrong result or a signal: report what was measured so far, keep the run directories for a
        # look, and exit non-zero.
        failure = str(e.code)
        log(failure)
    load_end = load()
    if failure:
        log(f"keeping the run directories in {root}")
    elif not args.keep:
        log(f"removing {root}")
        shutil.rmtree(root, ignore_errors=True)

    # The report.
    cols = [c.name for c in rf + lg + b]
    rss_cols = ["rf", "lg"] + (["B"] if b else [])
    rss_titles = {"rf": "ralph-flow RSS", "lg": "LangGraph RSS", "B": f"{args.label_b} RSS"}
    versions = {x: sh([x, "--version"]) for x in binaries}
    lines = [f"**INCOMPLETE**: the benchmark stopped: {failure.splitlines()[0]}", ""] if failure else []
    lines += [
        f"Side-by-side run of {started.strftime('%Y-%m-%d %H:%M UTC')}: ralph-flow commit "
        f"`{sh(['git', 'rev-parse', 'HEAD'], cwd=REPO)}` (the checkout of this script; last change "
        f"to the engine `{sh(['git', 'log', '-1', '--format=%h', '--', 'engine', 'Cargo.toml', 'Cargo.lock'], cwd=REPO)}`), "
        f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}.",
        "",
        f"- load average (1, 5, 15 min): {load_start} at the start, {load_end} at the end",
        f"- ralph-flow: `{args.ralph_flow}` ({versions[args.ralph_flow]})",
    ]
    if args.ralph_flow_b:
        lines.append(f"- {args.label_b}: `{args.ralph_flow_b}` ({versions[args.ralph_flow_b]})")
    lines += [
        f"- LangGraph: {lg_versions}",
        f"- repetitions: {reps} (chains of 5,000 stages or more: {args.reps_large}), "
        "configurations interleaved within each; medians",
        "",
        "µs per stage: (whole-process wall time of the run of N stages − that of the smallest run "
        "of the same shape) / (the difference in stages); RSS: the median max RSS of the process "
        "at N, NORMAL (GNU time; os.wait4 without it). Resume rows: the whole `ralph-flow resume` process, in ms.",
        "",
        "| scenario | N | " + " | ".join(f"{c} µs/stage" if i == 0 else c for i, c in enumerate(cols))
        + " | " + " | ".join(rss_titles[k] for k in rss_cols) + " |",
        "| --- | ---: |" + " ---: |" * (len(cols) + len(rss_cols)),
    ]
    for r in rows:
        lines.append(
            f"| {r.scenario} | {r.size} | "
            + " | ".join(r.cells.get(c, "–") for c in cols)
            + " | " + " | ".join(r.rss.get(k, "–") for k in rss_cols) + " |"
        )
    lines += [
        "",
        "Details: the median whole-process time at N and of the baseline, the cost per stage of "
        "each repetition (µs), LangGraph's in-process `invoke` time per node (no interpreter start, "
        "imports or compilation), the median max RSS at N, and the size of the SQLite store (with its "
        "WAL) at the end of the run at N (ralph-flow: `state.db`, without the artifact files).",
        "",
        "| scenario | N | configuration | median at N | median baseline | per stage, each repetition | LangGraph in-process per node | max RSS | SQLite store |",
        "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines += r.details
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if failure:
        sys.exit(1)


if __name__ == "__main__":
    main()
