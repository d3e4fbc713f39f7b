"""Instructions per stage (callgrind, every thread) of a replayed chain of no-op agent
stages and of a loop of two, for each binary given: (I(201 stages) - I(1)) / 200, NORMAL and
FULL. Usage: python3 benches/side_by_side/callgrind.py BEFORE AFTER (from the repository).
Counts do not move with the load of the machine, unlike wall times."""
import subprocess, sys, tempfile, re, os, shutil
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as rb

def instr(binary, wf, full):
    d = Path(tempfile.mkdtemp(dir=os.environ.get("CG_DIR", "target"), prefix="cg-")).resolve()
    rb.write_workflow(d / "w", wf)
    w = d / "w"
    out = w / "cg.out"
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--trace-children=no",
            binary, "run", "w.toml", "--replay", "rec.jsonl", "--progress", "quiet", "--state-dir", "state"]
    if full:
        argv.append("--full-sync")
    p = subprocess.run(argv, cwd=w, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stderr[-2000:]); raise SystemExit(1)
    total = 0
    # Sum the totals of every thread's file.
    for f in w.glob("cg.out*"):
        for line in f.read_text().splitlines():
            if line.startswith("totals:") or line.startswith("summary:"):
                total += int(line.split()[1]); break
    shutil.rmtree(d)
    return total

def main():
    bins = [str(Path(b).resolve()) for b in sys.argv[1:]]
    cases = [("chain of no-op agent stages", rb.chain_workflow(1), rb.chain_workflow(201), 200),
             ("loop, 2 stages per iteration", rb.loop_workflow(1), rb.loop_workflow(101), 200)]
    print("| scenario | sync | " + " | ".join(bins) + " |")
    for name, small, big, stages in cases:
        for full in (False, True):
            row = []
            for b in bins:
                row.append((instr(b, big, full) - instr(b, small, full)) / stages)
            print(f"| {name} | {'FULL' if full else 'NORMAL'} | " + " | ".join(f"{x:,.0f}" for x in row) + " |", flush=True)

main()
