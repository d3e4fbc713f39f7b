#!/usr/bin/env python3
"""Captures real agents over the Agent Client Protocol (ACP), for the fake ACP agent.

Runs each ACP agent (claude through claude-agent-acp, gemini --acp, qwen --acp, opencode acp)
against tests/realcli/mock_api.py, acting as the ACP client exactly as ralph-flow does:

  initialize        protocolVersion 1, clientCapabilities {fs: {readTextFile: true,
                    writeTextFile: true}, terminal: false}
  session/new       {cwd, mcpServers: []}
  session/prompt    [{type: text, text}]
  fs/read_text_file, fs/write_text_file   served inside the cwd
  session/request_permission              answered by the case's decisions (the commit
                                          allowed, the push rejected...)
  session/cancel    in the cancel case, a few seconds into the turn

and records every message both ways, normalized, as
tests/fakes/captures/acp/<agent>/<case>.jsonl (one {"from": "agent"|"client", "msg": {...}}
a line), with <case>.stderr, <case>.exit (the agent's exit code once its stdin is closed after
the turn) and <case>.repo (the workspace's commits and files, and the commits the bare
`origin` remote next to it received). The versions go to tests/fakes/captures/VERSIONS.

Each case runs in a fresh HOME and cwd: a git repository with one commit (README.md) and a
bare `origin` remote next to it, with no environment but PATH, HOME and the agent's settings.
Normalized: the cwd is /WORK, HOME /HOME, the case's directory (where origin.git is)
/CAPTURE, the install directory /CLI, the mock's port MOCKPORT, session ids
00000000-0000-4000-8000-000000000000, millisecond timestamps 1700000000000, ISO times
2023-11-14T22:13:20.000Z, durations 1.

Usage: tests/realcli/acp_capture.py [--realcli DIR] [AGENT/CASE | AGENT ...]
  (default: every case of every agent; DIR defaults to target/realcli)
Python 3.11, standard library only.
"""

import argparse
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = os.path.join(ROOT, "tests", "fakes", "captures", "acp")
SESSION = "00000000-0000-4000-8000-000000000000"
TURN_TIMEOUT = 180


def allow_unless_push(tool_call):
    """The edit cases' policy: every tool call allowed but a `git push`."""
    return "reject" if "git push" in json.dumps(tool_call) else "allow"


# name: (mock scenario, prompt, decide(tool_call) -> "allow" | "reject", cancel after seconds)
CASES = {
    "ok": ("ok", "Reply with a short greeting.", None, None),
    "edit_commit_push": (
        "acp_edit",
        "Write notes.txt, commit it with git, then push to origin.",
        allow_unless_push,
        None,
    ),
    # The same turn with every permission allowed (the push reaches origin.git) and every one
    # rejected: the branches the fake follows when a client decides otherwise.
    "edit_commit_push+allow_all": (
        "acp_edit",
        "Write notes.txt, commit it with git, then push to origin.",
        lambda tc: "allow",
        None,
    ),
    "edit_commit_push+reject_all": (
        "acp_edit",
        "Write notes.txt, commit it with git, then push to origin.",
        lambda tc: "reject",
        None,
    ),
    # claude in the mode claude-agent-acp starts a session in (below).
    "edit_auto_mode": (
        "acp_edit",
        "Write notes.txt, commit it with git, then push to origin.",
        allow_unless_push,
        None,
    ),
    "read": ("acp_read", "Read README.md and summarize it.", allow_unless_push, None),
    "cancel": ("slow", "Reply with a short greeting.", allow_unless_push, 3.0),
    "invalid_key": ("invalid_key", "Reply with a short greeting.", None, None),
    "rate_limit": ("rate_limit", "Reply with a short greeting.", None, None),
}
AGENTS = ("claude", "gemini", "qwen", "opencode")
# Cases only some agents have.
ONLY = {"edit_auto_mode": ("claude",)}
# The session mode set (session/set_mode) right after session/new. claude-agent-acp starts a
# session in its `auto` mode, where a classifier (a model request of its own) decides each
# tool call and nothing is asked of the client; its `default` mode ("Always ask before making
# changes") asks the client (session/request_permission) for each edit and command.
SESSION_MODE = {"claude": "default"}


def agent_command(agent, bindir, base, d):
    """(argv, env) of an agent in case directory d, its model API at base (with the scenario)."""
    home = os.path.join(d, "home")
    syspath = os.path.dirname(shutil.which("node") or "/usr/bin/node") + ":/usr/local/bin:/usr/bin:/bin"
    env = {"PATH": syspath, "HOME": home}
    if agent == "claude":
        env.update(
            ANTHROPIC_BASE_URL=base,
            ANTHROPIC_API_KEY="sk-ant-mock-key",
            CLAUDE_CODE_MAX_RETRIES="0",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
        return [os.path.join(bindir, "claude-agent-acp")], env
    if agent == "gemini":
        os.makedirs(os.path.join(home, ".gemini"), exist_ok=True)
        with open(os.path.join(home, ".gemini", "settings.json"), "w") as f:
            json.dump({"security": {"auth": {"selectedType": "gemini-api-key"}}, "general": {"maxAttempts": 1}}, f)
        env.update(GEMINI_API_KEY="mock-key", GOOGLE_GEMINI_BASE_URL=base, GEMINI_CLI_TRUST_WORKSPACE="true")
        return [os.path.join(bindir, "gemini"), "--acp"], env
    if agent == "qwen":
        os.makedirs(os.path.join(home, ".qwen"), exist_ok=True)
        with open(os.path.join(home, ".qwen", "settings.json"), "w") as f:
            json.dump({"model": {"generationConfig": {"maxRetries": 0}}}, f)
        env.update(OPENAI_API_KEY="mock-key", OPENAI_BASE_URL=base + "/v1", OPENAI_MODEL="qwen-mock")
        return [os.path.join(bindir, "qwen"), "--acp"], env
    if agent == "opencode":
        os.makedirs(os.path.join(home, ".config", "opencode"), exist_ok=True)
        with open(os.path.join(home, ".config", "opencode", "opencode.json"), "w") as f:
            json.dump(
                {
                    "provider": {
                        "mock": {
                            "npm": "@ai-sdk/openai-compatible",
                            "name": "Mock",
                            "options": {"baseURL": base + "/v1", "apiKey": "mock-key"},
                            "models": {"mock-model": {"name": "Mock"}},
                        }
                    },
                    "model": "mock/mock-model",
                    "autoupdate": False,
                    "share": "disabled",
                },
                f,
            )
        return [os.path.join(bindir, "opencode"), "acp"], env
    raise ValueError(agent)


def git(cwd, *args):
    return subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True, check=False).stdout


def make_workspace(d):
    """A git repository with README.md committed and a bare `origin` remote next to it."""
    cwd = os.path.join(d, "cwd")
    os.makedirs(cwd)
    os.makedirs(os.path.join(d, "home"))
    subprocess.run(["git", "init", "-q", "--bare", os.path.join(d, "origin.git")], check=True)
    subprocess.run(["git", "init", "-q", cwd], check=True)
    git(cwd, "config", "user.email", "t@t")
    git(cwd, "config", "user.name", "t")
    with open(os.path.join(cwd, "README.md"), "w") as f:
        f.write("# Mock project\n\nA project for the ACP captures.\n")
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "-m", "init")
    git(cwd, "remote", "add", "origin", os.path.join(d, "origin.git"))
    git(cwd, "push", "-q", "origin", "HEAD")
    return cwd


class Normalizer:
    def __init__(self, d, cwd, home, cli, port):
        # Longest first: the cwd and HOME are inside the case's directory.
        self.pairs = [(cwd, "/WORK"), (home, "/HOME"), (d, "/CAPTURE"), (cli, "/CLI"), ("127.0.0.1:%d" % port, "127.0.0.1:MOCKPORT")]
        self.sessions = {}

    def text(self, t):
        for a, b in self.pairs:
            t = t.replace(a, b)
        t = re.sub(r"(?<![0-9])1[6-9][0-9]{11}(?![0-9])", "1700000000000", t)
        t = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "2023-11-14T22:13:20.000Z", t)
        for s, n in self.sessions.items():
            t = t.replace(s, n)
        return t

    def session(self, sid):
        if sid and sid not in self.sessions:
            self.sessions[sid] = SESSION if not self.sessions else "%s-%d" % (SESSION[:-2], len(self.sessions))

    def value(self, v):
        """Normalizes a decoded message: its strings, then durations."""
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if k in ("durationMs", "duration_ms", "duration_api_ms", "elapsedMs") and isinstance(x, (int, float)):
                    x = 1
                out[k] = self.value(x)
            return out
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, str):
            return self.text(v)
        return v


class Client:
    """The client side of one ACP connection, recording both directions."""

    def __init__(self, proc, cwd, decide):
        self.proc = proc
        self.cwd = cwd
        self.decide = decide
        self.log = []  # (from, msg or raw line)
        self.q = queue.Queue()
        self.next_id = 0
        self.decisions = []
        threading.Thread(target=self.reader, daemon=True).start()

    def reader(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                self.log.append(("agent", {"raw": line}))
                continue
            self.log.append(("agent", msg))
            self.q.put(msg)
        self.q.put(None)

    def send(self, msg):
        self.log.append(("client", msg))
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def request(self, method, params, timeout=TURN_TIMEOUT, cancel_after=None, session=None):
        rid = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        start = time.monotonic()
        cancelled = False
        while True:
            left = start + timeout - time.monotonic()
            if cancel_after is not None and not cancelled:
                left = min(left, start + cancel_after - time.monotonic())
            if left <= 0:
                if cancel_after is not None and not cancelled and time.monotonic() >= start + cancel_after:
                    cancelled = True
                    self.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}})
                    continue
                return None
            try:
                msg = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                return None
            if msg.get("id") == rid and "method" not in msg:
                return msg
            if "method" in msg and "id" in msg:
                self.serve(msg)

    def serve(self, msg):
        method, params, rid = msg["method"], msg.get("params") or {}, msg["id"]

        def result(r):
            self.send({"jsonrpc": "2.0", "id": rid, "result": r})

        def error(code, message):
            self.send({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})

        if method == "session/request_permission":
            decision = self.decide(params.get("toolCall")) if self.decide else "allow"
            self.decisions.append(decision)
            kinds = ("allow_once", "allow_always") if decision == "allow" else ("reject_once", "reject_always")
            options = params.get("options") or []
            chosen = next((o for k in kinds for o in options if o.get("kind") == k), None)
            if chosen is None:
                return result({"outcome": {"outcome": "cancelled"}})
            return result({"outcome": {"outcome": "selected", "optionId": chosen["optionId"]}})
        if method in ("fs/read_text_file", "fs/write_text_file"):
            path = os.path.realpath(params.get("path", ""))
            if not path.startswith(os.path.realpath(self.cwd) + os.sep):
                return error(-32602, "path outside the workspace: %s" % params.get("path"))
            try:
                if method == "fs/write_text_file":
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(params.get("content", ""))
                    return result(None)
                with open(path, encoding="utf-8") as f:
                    lines = f.read().splitlines(keepends=True)
                first = max((params.get("line") or 1) - 1, 0)
                limit = params.get("limit")
                chosen = lines[first:first + limit] if limit else lines[first:]
                return result({"content": "".join(chosen)})
            except OSError as e:
                return error(-32603, str(e))
        return error(-32601, "Method not found: %s" % method)


def run_case(agent, case, bindir, port, work, cli):
    scenario, prompt, decide, cancel_after = CASES[case]
    d = os.path.join(work, "%s-%s" % (agent, case.replace("+", "-")))
    cwd = make_workspace(d)
    home = os.path.join(d, "home")
    argv, env = agent_command(agent, bindir, "http://127.0.0.1:%d/s/%s" % (port, scenario), d)
    stderr = open(os.path.join(d, "stderr"), "w")
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
        text=True, bufsize=1, start_new_session=True,
    )
    c = Client(proc, cwd, decide)
    init = c.request(
        "initialize",
        {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": False},
            "clientInfo": {"name": "ralph-flow", "version": "0.1.0"},
        },
        timeout=60,
    )
    outcome = "no initialize answer"
    if init and "result" in init:
        new = c.request("session/new", {"cwd": cwd, "mcpServers": []}, timeout=60)
        sid = ((new or {}).get("result") or {}).get("sessionId")
        outcome = "session/new: %s" % ((new or {}).get("error") or "no answer")
        mode = SESSION_MODE.get(agent)
        if sid and mode and case != "edit_auto_mode":
            c.request("session/set_mode", {"sessionId": sid, "modeId": mode}, timeout=60)
        if sid:
            resp = c.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]},
                cancel_after=cancel_after,
                session=sid,
            )
            outcome = "prompt: %s" % json.dumps((resp or {}).get("result") or (resp or {}).get("error") or "no answer")[:200]
    # Stray messages after the turn, then the end of the connection.
    time.sleep(1.0)
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        code = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 15)
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            code = proc.wait()
    else:
        try:
            os.killpg(proc.pid, 15)  # its leftover children
        except OSError:
            pass
    stderr.close()
    elapsed = time.monotonic() - start

    norm = Normalizer(d, cwd, home, cli, port)
    for _, msg in c.log:
        if isinstance(msg, dict):
            for holder in (msg.get("params") or {}, msg.get("result") or {}):
                if isinstance(holder, dict) and isinstance(holder.get("sessionId"), str):
                    norm.session(holder["sessionId"])
    outdir = os.path.join(OUT, agent)
    os.makedirs(outdir, exist_ok=True)
    base = os.path.join(outdir, case)
    with open(base + ".jsonl", "w", encoding="utf-8") as f:
        for who, msg in c.log:
            f.write(json.dumps({"from": who, "msg": norm.value(msg)}, ensure_ascii=False) + "\n")
    with open(os.path.join(d, "stderr"), encoding="utf-8", errors="replace") as f:
        err = norm.text(f.read())
    with open(base + ".stderr", "w", encoding="utf-8") as f:
        f.write(err)
    with open(base + ".exit", "w") as f:
        f.write("%d\n" % code)
    files = subprocess.run(
        ["git", "-C", cwd, "status", "--porcelain", "--untracked-files=all"], capture_output=True, text=True
    ).stdout
    with open(base + ".repo", "w") as f:
        f.write("commits: %s\n" % " ".join(git(cwd, "log", "--format=%s").split("\n")).strip())
        f.write("origin: %s\n" % " ".join(git(os.path.join(d, "origin.git"), "log", "--format=%s").split("\n")).strip())
        f.write("uncommitted: %s\n" % " ".join(files.split("\n")).strip())
        f.write("decisions: %s\n" % " ".join(c.decisions))
    print("captured acp %s/%s: %s, exit %d in %.0fs" % (agent, case, outcome, code, elapsed), file=sys.stderr)


def versions(bindir, work):
    path = os.path.join(ROOT, "tests", "fakes", "captures", "VERSIONS")
    with open(path) as f:
        lines = [l for l in f.read().splitlines() if not l.startswith("claude-agent-acp ")]
    pkg = os.path.join(bindir, "..", "@agentclientprotocol", "claude-agent-acp", "package.json")
    try:
        with open(pkg) as f:
            v = json.load(f).get("version")
        lines.append("claude-agent-acp %s" % v)
    except OSError:
        pass
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--realcli", default=os.path.join(ROOT, "target", "realcli"))
    ap.add_argument("only", nargs="*")
    args = ap.parse_args()
    cli = os.path.realpath(args.realcli)
    bindir = os.path.join(cli, "node_modules", ".bin")
    work = os.environ.get("CAPTURE_WORK") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ralph-flow-acp-capture"
    )
    work = os.path.realpath(work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    todo = []
    for agent in AGENTS:
        for case in CASES:
            if agent not in ONLY.get(case, (agent,)):
                continue
            if args.only and not any(o in (agent, "%s/%s" % (agent, case)) for o in args.only):
                continue
            todo.append((agent, case))
    mock = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "realcli", "mock_api.py"), "0"],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, MOCK_LOG=os.path.join(work, "mock.log"), MOCK_SLOW_SECONDS="60"),
    )
    try:
        port = int(mock.stdout.readline())
        versions(bindir, work)
        for agent, case in todo:
            exe = os.path.join(bindir, "claude-agent-acp" if agent == "claude" else agent)
            if not os.access(exe, os.X_OK):
                print("acp_capture: %s not found: run tests/realcli/install.sh first" % exe, file=sys.stderr)
                return 1
            run_case(agent, case, bindir, port, work, cli)
    finally:
        mock.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
