"""What writing the attempts' records to SQLite would add to a commit: commits like a replayed
chain's (an attempt row and a node row each), with and without two records per commit (a no-op
agent stage files three, prompt.md, raw.txt, answer.md, over its two commits), in WAL mode with
1 KiB pages, synchronous NORMAL and FULL. Prints µs per commit and WAL frames per commit (the frames do not depend on the machine's
load). Usage: python3 benches/side_by_side/sqlite_records_cost.py [DIR for the files]."""
import os, sqlite3, sys, tempfile, time

SCHEMA = """
CREATE TABLE nodes (run TEXT NOT NULL, scope TEXT NOT NULL, node TEXT NOT NULL, seq INTEGER,
  state TEXT NOT NULL, output TEXT, action TEXT, feedback TEXT, attempts INTEGER NOT NULL,
  input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
  cost_usd REAL, started_at INTEGER NOT NULL, finished_at INTEGER NOT NULL, message TEXT,
  PRIMARY KEY (run, scope, node)) WITHOUT ROWID;
CREATE TABLE attempts (run TEXT NOT NULL, scope TEXT NOT NULL, node TEXT NOT NULL,
  attempt INTEGER NOT NULL, state TEXT NOT NULL, agent TEXT, dir TEXT NOT NULL, error TEXT,
  input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
  cost_usd REAL, started_at INTEGER NOT NULL, finished_at INTEGER,
  PRIMARY KEY (run, scope, node, attempt)) WITHOUT ROWID;
CREATE TABLE artifacts (run TEXT NOT NULL, path TEXT NOT NULL, text BLOB NOT NULL,
  PRIMARY KEY (run, path)) WITHOUT ROWID;
"""
RUN = "20261127-125959-3f2a9c"
DIR = "/work/project/.ralph-flow/runs/" + RUN

def measure(sync, records, n, root):
    path = os.path.join(root, f"s-{sync}-{records}.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA page_size=1024"); c.execute("PRAGMA journal_mode=WAL")
    c.execute(f"PRAGMA synchronous={sync}")
    c.executescript(SCHEMA)
    c.execute("PRAGMA wal_autocheckpoint=0")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    t = time.perf_counter()
    for i in range(n):
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                  (RUN, "", f"s{i}", 1, "ok", "bot", f"{DIR}/s{i}/attempt-1", None, 10, 2, 0, None, 1, 2))
        c.execute("INSERT OR REPLACE INTO nodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                  (RUN, "", f"s{i}", i, "done", f'"ok {i}"', None, None, 1, 10, 2, 0, None, 1, 2, "done"))
        for name, text in [("prompt.md", f"step {i}"), ("raw.txt", "ok")][:records]:
            c.execute("INSERT OR REPLACE INTO artifacts VALUES (?,?,?)", (RUN, f"s{i}/attempt-1/{name}", text.encode()))
        c.execute("COMMIT")
    dt = (time.perf_counter() - t) / n * 1e6
    frames = (os.path.getsize(path + "-wal") - 32) / (1024 + 24) / n
    c.close()
    return dt, frames

root = tempfile.mkdtemp(dir=sys.argv[1] if len(sys.argv) > 1 else None)
n = 3000
print("| sync | records per commit | µs per commit (median of 5) | WAL pages per commit |")
print("| --- | ---: | ---: | ---: |")
for sync in ("NORMAL", "FULL"):
    res = {0: [], 2: []}
    for rep in range(5):
        for records in (0, 2):  # interleaved
            res[records].append(measure(sync, records, n if sync == "NORMAL" else 1000, root))
            for f in os.listdir(root): os.remove(os.path.join(root, f))
    for records in (0, 2):
        times = sorted(x[0] for x in res[records])
        print(f"| {sync} | {records} | {times[2]:.1f} | {res[records][0][1]:.2f} |", flush=True)
os.rmdir(root)
