#!/usr/bin/env python3
"""A fake ACP agent: replays a real agent's captured side of an Agent Client Protocol session.

Run with cwd = the workspace and
  FAKE_ACP_CASE      <agent>/<case>: tests/fakes/captures/acp/<agent>/<case>.jsonl (required
                     unless FAKE_MODE is crash or garbage)
  FAKE_ACP_CAPTURES  the captures' directory (default ../captures/acp next to this file)
  FAKE_REPLY, FAKE_REPLY_FILE   the final answer text, in place of the captured one
  FAKE_LOG           a file it appends what it received to (one JSON object a line)
  FAKE_MODE          replay (default), hang, ignore_cancel, crash, garbage

It answers initialize, session/new, session/set_mode and session/prompt with the captured
responses (the client's ids, a session id of its own), sends the captured session/update
notifications and agent->client requests in order and waits for the client's answer to each.
It holds the client to the protocol: session/prompt before session/new or with an unknown
session id is refused with the JSON-RPC error the real agent gave; a permission answer must
name one of the offered optionIds (else exit 2); a permission decided otherwise than in the
capture (allowed vs rejected) follows the capture of the other decision
(<case>+<variant>.jsonl) when one has the same decisions so far, else exit 3. A command the
captured agent ran itself after a permission, or a file it wrote itself (not through
fs/write_text_file), is run (sh -c) or written for real in the cwd, only when the client
allowed it. See tests/fakes/README.md, "ACP".
"""

import glob
import json
import os
import queue
import re
import subprocess
import sys
import threading
import uuid

REPLY = "MOCK-REPLY-4F7: the mock model says hello."
CAPTURED_SESSION = "00000000-0000-4000-8000-000000000000"
CAPTURED_CWD = "/WORK"


def die(code, message):
    sys.stderr.write("fake acp agent: %s\n" % message)
    sys.stderr.flush()
    os._exit(code)


class Capture:
    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)[: -len(".jsonl")]
        self.msgs = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    e = json.loads(line)
                    self.msgs.append((e["from"], e["msg"]))

    def client_answer(self, i):
        """The index of the client's answer to the agent request at index i."""
        rid = self.msgs[i][1].get("id")
        for j in range(i + 1, len(self.msgs)):
            who, m = self.msgs[j]
            if who == "client" and "method" not in m and m.get("id") == rid:
                return j
        return None

    def decision(self, i):
        """'allow' or 'reject': the captured client's answer to the permission request at i."""
        j = self.client_answer(i)
        if j is None:
            return None
        return decision_of(self.msgs[i][1], self.msgs[j][1])

    def permissions_before(self, i):
        return [k for k in range(i) if self.is_permission(k)]

    def is_permission(self, k):
        who, m = self.msgs[k]
        return who == "agent" and m.get("method") == "session/request_permission" and "id" in m


def decision_of(request, answer):
    outcome = ((answer.get("result") or {}).get("outcome")) or {}
    if outcome.get("outcome") != "selected":
        return "reject"
    options = (request.get("params") or {}).get("options") or []
    kind = next((o.get("kind", "") for o in options if o.get("optionId") == outcome.get("optionId")), "")
    return "allow" if kind.startswith("allow") else "reject"


class Fake:
    def __init__(self):
        self.mode = os.environ.get("FAKE_MODE", "replay") or "replay"
        self.case = os.environ.get("FAKE_ACP_CASE", "")
        self.cwd = os.getcwd()
        self.log_path = os.environ.get("FAKE_LOG")
        here = os.path.dirname(os.path.abspath(__file__))
        self.dir = os.environ.get("FAKE_ACP_CAPTURES") or os.path.join(here, "..", "captures", "acp")
        self.reply = None
        if os.environ.get("FAKE_REPLY_FILE"):
            with open(os.environ["FAKE_REPLY_FILE"], encoding="utf-8") as f:
                self.reply = f.read()
        elif "FAKE_REPLY" in os.environ:
            self.reply = os.environ["FAKE_REPLY"]
        self.session = str(uuid.uuid4())
        self.sessions = set()
        self.initialized = False
        self.next_id = 0
        self.q = queue.Queue()
        self.out_lock = threading.Lock()
        self.pending = []  # client messages read ahead while waiting for something else
        self.captures = []
        if self.mode in ("replay", "hang", "ignore_cancel"):
            if "/" not in self.case:
                die(2, "FAKE_ACP_CASE must be <agent>/<case> (got %r)" % self.case)
            base = os.path.join(self.dir, self.case)
            if not os.path.exists(base + ".jsonl"):
                die(2, "no capture %s.jsonl" % base)
            self.captures = [Capture(base + ".jsonl")] + [Capture(p) for p in sorted(glob.glob(glob.escape(base) + "+*.jsonl"))]
        self.cap = self.captures[0] if self.captures else None
        self.decisions = []
        self.log({"fake": "acp", "case": self.case, "mode": self.mode, "cwd": self.cwd, "pid": os.getpid()})

    # ---- I/O ---------------------------------------------------------------------------

    def log(self, obj):
        if self.log_path:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(obj) + "\n")

    def reader(self):
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                self.log({"received_garbage": line.rstrip("\n")})
                die(2, "the client sent a line that is not JSON: %r" % line[:200])
            self.log({"received": msg})
            self.q.put(msg)
        self.q.put(None)

    def send(self, msg):
        with self.out_lock:
            sys.stdout.write(json.dumps(msg, ensure_ascii=False) + "\n")
            sys.stdout.flush()

    def receive(self):
        """The client's next message (None at the end of its input)."""
        if self.pending:
            return self.pending.pop(0)
        return self.q.get()

    # ---- substitution ------------------------------------------------------------------

    def subst(self, v):
        if isinstance(v, dict):
            return {k: self.subst(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.subst(x) for x in v]
        if isinstance(v, str):
            v = v.replace(CAPTURED_SESSION, self.session)
            return re.sub(r"/WORK(?![A-Za-z0-9_])", lambda _: self.cwd, v)
        return v

    def local(self, path):
        if isinstance(path, str) and (path == CAPTURED_CWD or path.startswith(CAPTURED_CWD + "/")):
            return self.cwd + path[len(CAPTURED_CWD):]
        return path

    # ---- the protocol ------------------------------------------------------------------

    def error(self, rid, code, message, data=None):
        err = {"code": code, "message": message}
        if data is not None:
            err["data"] = data
        self.send({"jsonrpc": "2.0", "id": rid, "error": err})

    def captured_error(self, method, fallback_code, fallback_message):
        """The error the real agent answered `method` with in some capture of this agent
        (a case named unknown_session), else the fallback."""
        agent = self.case.split("/")[0]
        path = os.path.join(self.dir, agent, "unknown_session.jsonl")
        if os.path.exists(path):
            c = Capture(path)
            for i, (who, m) in enumerate(c.msgs):
                if who == "client" and m.get("method") == method:
                    for who2, r in c.msgs[i + 1:]:
                        if who2 == "agent" and r.get("id") == m.get("id") and "error" in r:
                            return r["error"]
        return {"code": fallback_code, "message": fallback_message}

    def run(self):
        threading.Thread(target=self.reader, daemon=True).start()
        if self.mode == "garbage":
            msg = self.receive()
            self.send_raw("Loading configuration... this is not JSON {")
            while msg is not None:
                msg = self.receive()
            return 0
        if self.mode == "crash":
            msg = self.receive()
            if msg is not None and msg.get("method") == "initialize":
                self.send({"jsonrpc": "2.0", "id": msg.get("id"), "result": {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}})
            die(1, "fatal: the fake agent crashed (FAKE_MODE=crash)")
        # Replay: where we are in the capture.
        self.pos = 0
        while True:
            msg = self.receive()
            if msg is None:
                return self.exit_code()
            if "method" not in msg:
                # An answer to no request of ours at this point.
                continue
            method, rid = msg["method"], msg.get("id")
            if rid is None:
                # A notification: session/cancel outside a turn is ignored, as the agents do.
                continue
            self.request(method, rid, msg.get("params") or {})

    def send_raw(self, text):
        with self.out_lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def exit_code(self):
        path = self.cap.path[: -len(".jsonl")] + ".exit" if self.cap else None
        try:
            with open(path) as f:
                return int(f.read().strip() or 0)
        except (OSError, TypeError, ValueError):
            return 0

    def find_request(self, method):
        """The index of the captured client request `method` at or after pos."""
        for i in range(self.pos, len(self.cap.msgs)):
            who, m = self.cap.msgs[i]
            if who == "client" and m.get("method") == method and "id" in m:
                return i
        for i in range(0, len(self.cap.msgs)):
            who, m = self.cap.msgs[i]
            if who == "client" and m.get("method") == method and "id" in m:
                return i
        return None

    def request(self, method, rid, params):
        if method == "initialize":
            self.initialized = True
        elif not self.initialized:
            return self.error(rid, -32600, "%s before initialize" % method)
        if method in ("session/prompt", "session/set_mode", "session/set_config_option"):
            sid = params.get("sessionId")
            if sid not in self.sessions:
                err = self.captured_error(
                    "session/prompt",
                    -32602,
                    "Session not found" if self.sessions else "Session not found (no session/new yet)",
                )
                self.send({"jsonrpc": "2.0", "id": rid, "error": err})
                return None
        if method == "session/prompt" and self.mode in ("hang", "ignore_cancel"):
            return self.hang(rid)
        i = self.find_request(method)
        if i is None:
            return self.error(rid, -32601, "Method not found: %s" % method)
        self.replay_segment(i, rid)
        if method == "session/new":
            self.sessions.add(self.session)
        return None

    def hang(self, rid):
        while True:
            msg = self.receive()
            if msg is None:
                return None
            if msg.get("method") == "session/cancel" and self.mode == "hang":
                self.send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "cancelled"}})
                return None

    def replay_segment(self, i, rid):
        """Replays what the agent sent from the captured request at i to its answer, and after
        it up to the next client request; the answer gets the client's id `rid`."""
        captured_id = self.cap.msgs[i][1]["id"]
        k = i + 1
        merged, merged_for = self.merge_reply(k, captured_id), self.cap
        while k < len(self.cap.msgs):
            if merged_for is not self.cap:
                # Another capture followed since a permission was decided otherwise.
                merged, merged_for = self.merge_reply(k, captured_id), self.cap
            who, m = self.cap.msgs[k]
            if who == "client":
                if "method" in m and "id" in m:
                    break  # the next client request: the segment ends
                if m.get("method") == "session/cancel":
                    if not self.wait_cancel():
                        return
                k += 1
                continue
            if "method" not in m:
                if m.get("id") == captured_id:
                    out = dict(m, id=rid)
                    self.send(self.subst(out))
                k += 1
                continue
            if k in merged:
                if merged[k] is not None:
                    self.send(self.subst(merged[k]))
                k += 1
                continue
            if "id" not in m:
                self.send(self.subst(m))
                k += 1
                continue
            # An agent -> client request.
            nk = self.agent_request(k)
            if nk is None:
                return  # the turn was cancelled
            k = nk
        self.pos = k

    def merge_reply(self, start, captured_id):
        """The agent_message_chunk notifications (index -> replacement or None) to send in
        place of the captured final answer: the chunks holding the mock's reply, merged into
        one with FAKE_REPLY's text."""
        if self.reply is None:
            return {}
        msgs = self.cap.msgs
        chunks = []
        for k in range(start, len(msgs)):
            who, m = msgs[k]
            if who == "agent" and m.get("id") == captured_id and "method" not in m:
                break
            u = ((m.get("params") or {}).get("update")) or {}
            if who == "agent" and u.get("sessionUpdate") == "agent_message_chunk" and (u.get("content") or {}).get("type") == "text":
                chunks.append(k)
        # The run of chunks whose text, joined, holds the reply.
        for a in range(len(chunks)):
            text = ""
            for b in range(a, len(chunks)):
                text += msgs[chunks[b]][1]["params"]["update"]["content"]["text"]
                if REPLY in text:
                    first = json.loads(json.dumps(msgs[chunks[a]][1]))
                    first["params"]["update"]["content"]["text"] = text.replace(REPLY, self.reply)
                    out = {chunks[a]: first}
                    for c in chunks[a + 1 : b + 1]:
                        out[c] = None
                    return out
        return {}

    def wait_cancel(self):
        """Waits for the client's session/cancel (captured here); False at the end of input."""
        while True:
            msg = self.receive()
            if msg is None:
                return False
            if msg.get("method") == "session/cancel":
                return True
            self.pending_other(msg)

    def pending_other(self, msg):
        if "method" in msg and "id" in msg:
            self.error(msg["id"], -32603, "the fake agent is busy with a turn (%s not expected here)" % msg["method"])

    def agent_request(self, k):
        """Sends the captured agent request at k, waits for the client's answer; returns the
        index to go on from (in the capture followed from then on)."""
        m = self.cap.msgs[k][1]
        self.next_id += 1
        out = dict(self.subst(m), id=self.next_id - 1)
        self.send(out)
        while True:
            answer = self.receive()
            if answer is None:
                die(3, "the client closed the connection without answering %s" % m.get("method"))
            if "method" not in answer and answer.get("id") == out["id"]:
                break
            if answer.get("method") == "session/cancel":
                # Cancelled while the client decides: the turn ends cancelled, as ACP says.
                continue
            self.pending_other(answer)
        j = self.cap.client_answer(k)
        if m.get("method") != "session/request_permission":
            return (j if j is not None else k) + 1
        options = (m.get("params") or {}).get("options") or []
        outcome = ((answer.get("result") or {}).get("outcome")) or {}
        if "error" in answer:
            die(2, "the client answered session/request_permission with an error: %s" % json.dumps(answer["error"]))
        if outcome.get("outcome") == "selected":
            ids = [o.get("optionId") for o in options]
            if outcome.get("optionId") not in ids:
                self.error_to_client("optionId %r is none of the options offered %s" % (outcome.get("optionId"), ids))
                die(2, "the client chose optionId %r, none of the options offered: %s" % (outcome.get("optionId"), ids))
        elif outcome.get("outcome") != "cancelled":
            die(2, "the client's permission answer has no valid outcome: %s" % json.dumps(answer))
        decision = decision_of(m, answer)
        captured = self.cap.decision(k)
        nth = len(self.cap.permissions_before(k))
        if decision != captured:
            alt = self.alternative(nth, decision)
            if alt is None:
                die(
                    3,
                    "the client %s the permission request %d (%s) which the capture %s %s, and no capture "
                    "of %s follows that decision"
                    % ("allowed" if decision == "allow" else "rejected", nth + 1,
                       ((m.get("params") or {}).get("toolCall") or {}).get("title"),
                       self.cap.name, "allowed" if captured == "allow" else "rejected", self.case),
                )
            self.cap, k = alt
            j = self.cap.client_answer(k)
        self.decisions.append(decision)
        if decision == "allow":
            self.side_effect(k)
        return (j if j is not None else k) + 1

    def error_to_client(self, message):
        sys.stderr.write("fake acp agent: %s\n" % message)

    def alternative(self, nth, decision):
        """(capture, index of its nth permission request) of a capture whose decisions so far
        are ours and whose nth is `decision`."""
        for c in self.captures:
            perms = [k for k in range(len(c.msgs)) if c.is_permission(k)]
            if len(perms) <= nth:
                continue
            if [c.decision(k) for k in perms[:nth]] == self.decisions and c.decision(perms[nth]) == decision:
                return c, perms[nth]
        return None

    def side_effect(self, k):
        """What the captured agent did itself after the permission at k was granted."""
        m = self.cap.msgs[k][1]
        tc = (m.get("params") or {}).get("toolCall") or {}
        tid = tc.get("toolCallId")
        # Through the client? Then the client does it.
        for who, x in self.cap.msgs[k + 1 :]:
            if who == "agent" and x.get("method") == "fs/write_text_file":
                return
            u = ((x.get("params") or {}).get("update")) or {}
            if u.get("toolCallId") == tid and u.get("status") in ("completed", "failed"):
                break
            if who == "client" and "method" in x and "id" in x:
                break
        kind = tc.get("kind")
        raw = tc.get("rawInput") or {}
        if kind == "execute":
            cmd = raw.get("command") if isinstance(raw, dict) else None
            if isinstance(cmd, list):
                cmd = " ".join(cmd)
            if isinstance(cmd, str) and cmd:
                self.log({"ran": cmd})
                subprocess.run(["sh", "-c", cmd], cwd=self.cwd, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        elif kind == "edit":
            for c in tc.get("content") or []:
                if c.get("type") == "diff" and isinstance(c.get("newText"), str):
                    path = self.local(c.get("path"))
                    if not isinstance(path, str) or not os.path.abspath(path).startswith(self.cwd + os.sep):
                        continue
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(c["newText"])
                    self.log({"wrote": path})


def main():
    return Fake().run()


if __name__ == "__main__":
    sys.exit(main())
