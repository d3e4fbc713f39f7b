"""The LangGraph side of the side-by-side benchmark (see README.md in this directory).

One scenario, one process: run.py times the whole process (interpreter start, imports,
graph compilation and the run), the same way it times a whole `ralph-flow run`.

    python langgraph_bench.py SCENARIO N SYNC DB

SCENARIO  chain  : a StateGraph chain of N nodes, each returning a tiny state update
          loop   : a 2-node cycle with a conditional edge, N iterations (2N node runs)
          fanout : the Send API fanning out to one node N times, max_concurrency 64
SYNC      NORMAL or FULL: the SQLite `synchronous` setting of the checkpointer's connection
DB        the SQLite file of the SqliteSaver (created; journal_mode=WAL)

Every run uses durability="sync": a superstep's checkpoint is written before the next one
starts, as ralph-flow commits a stage before its dependents start. The result is checked
(the counter or the number of fan-out results) and the process exits non-zero when it is
wrong. It prints one JSON line: {"scenario", "n", "sync", "seconds"} where `seconds` is the
in-process time of the invoke alone (for reference; run.py reports whole-process times).
"""

import json
import operator
import sqlite3
import sys
import time
from typing import Annotated, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send


class Counter(TypedDict):
    count: int


class Fan(TypedDict):
    results: Annotated[list, operator.add]


class Item(TypedDict):
    i: int


def step(state: Counter) -> dict:
    return {"count": state["count"] + 1}


def chain(n: int):
    g = StateGraph(Counter)
    for i in range(n):
        g.add_node(f"s{i}", step)
        g.add_edge(START if i == 0 else f"s{i - 1}", f"s{i}")
    g.add_edge(f"s{n - 1}", END)
    return g, {"count": 0}, n + 10, lambda out: out["count"] == n


def loop(n: int):
    g = StateGraph(Counter)
    g.add_node("a", step)
    g.add_node("b", step)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    # `count` goes up by 2 an iteration: after iteration k it is 2k.
    g.add_conditional_edges("b", lambda s: "a" if s["count"] < 2 * n else END, ["a", END])
    return g, {"count": 0}, 2 * n + 10, lambda out: out["count"] == 2 * n


def fanout(n: int):
    g = StateGraph(Fan)
    g.add_node("work", lambda item: {"results": [item["i"]]})
    g.add_conditional_edges(START, lambda _: [Send("work", {"i": i}) for i in range(n)], ["work"])
    g.add_edge("work", END)
    return g, {"results": []}, 10, lambda out: sorted(out["results"]) == list(range(n))


def main() -> None:
    scenario, n, sync, db = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if sync not in ("NORMAL", "FULL"):
        sys.exit(f"SYNC must be NORMAL or FULL, not {sync}")
    graph, state, recursion_limit, ok = {"chain": chain, "loop": loop, "fanout": fanout}[scenario](n)
    conn = sqlite3.connect(db, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    # Make sure the setting took (FULL is 2, NORMAL is 1).
    want = {"NORMAL": 1, "FULL": 2}[sync]
    got = conn.execute("PRAGMA synchronous").fetchone()[0]
    if got != want:
        sys.exit(f"PRAGMA synchronous is {got}, wanted {want}")
    app = graph.compile(checkpointer=SqliteSaver(conn))
    config = {
        "configurable": {"thread_id": "bench"},
        "recursion_limit": recursion_limit,
        "max_concurrency": 64,
    }
    t = time.perf_counter()
    out = app.invoke(state, config, durability="sync")
    seconds = time.perf_counter() - t
    conn.close()
    if not ok(out):
        sys.exit(f"wrong result for {scenario} {n}: {str(out)[:200]}")
    print(json.dumps({"scenario": scenario, "n": n, "sync": sync, "seconds": seconds}))


if __name__ == "__main__":
    main()
