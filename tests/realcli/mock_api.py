#!/usr/bin/env python3
"""A local mock of the model APIs the real agent CLIs call, for tests/realcli.

Speaks, on 127.0.0.1 only:
  * the Anthropic Messages API (claude, via ANTHROPIC_BASE_URL): POST /v1/messages
    (streaming SSE and not), /v1/messages/count_tokens;
  * the OpenAI Responses API (codex, via a model provider's base_url): POST /v1/responses
    (SSE), GET /v1/models; and Chat Completions, POST /v1/chat/completions (SSE and not:
    qwen via OPENAI_BASE_URL, opencode via an openai-compatible provider's baseURL, with
    their tool calls in the write, denied and commit scenarios, and qwen's structured_output
    tool under --json-schema);
  * the Gemini API (gemini, via GOOGLE_GEMINI_BASE_URL): POST
    /v1beta/models/<model>:generateContent, :streamGenerateContent (SSE), :countTokens.

Usage: mock_api.py [PORT]   (0 or none: any free port). Prints the port on stdout, one line.

The scenario of a request is, in order: a path prefix `/s/<scenario>/` (so each CLI's base URL
can carry its own scenario), the first word of the file named by MOCK_SCENARIO_FILE, the
environment variable MOCK_SCENARIO, else `ok`. Scenarios:

  ok            a plain text answer holding the marker text
  structured    the answer the CLI expects for structured output (claude: a call of its
                structured-output tool; codex: JSON text; gemini: JSON text)
  write         first a request to write `mock-written.txt` in the cwd with the CLI's
                file-write tool, then (once the tool result comes back) a text answer
  server_error  HTTP 500 with the API's error body
  rate_limit    HTTP 429 with retry-after (Anthropic: also the unified rate-limit headers)
  overloaded    Anthropic 529 overloaded_error; OpenAI and Gemini 503
  invalid_key   Anthropic 401, OpenAI 401 invalid_api_key, Gemini 400 API_KEY_INVALID
  usage_limit   OpenAI only: 429 usage_limit_reached with resets_at (a ChatGPT plan's limit)
  denied        codex and gemini: the tool calls a permission setting may refuse, one per
                request (the next once the previous result is back), then a text answer
                (DENIED_ACTIONS: a write in the cwd, in its `.git`, outside it; a shell write
                outside it; `git add -A && git commit`; a failing command). The tools are
                called whether or not the CLI offers them (gemini's headless default offers
                no write or shell tool). The tool calls report no usage.
  commit        the same with two calls: the write in the cwd, `git add -A && git commit`
  acp_edit      for the ACP captures (tests/realcli/acp_capture.py), one tool call per request:
                a write of `notes.txt` in the cwd, `git add -A && git commit -q -m 'add notes'`,
                `git push origin HEAD` (ACP_EDIT_ACTIONS), then a text answer (all CLIs; claude
                with its Write and Bash tools)
  acp_read      a read of `README.md` in the cwd with the CLI's file-read tool, then a text
                answer
  slow          the answer after MOCK_SLOW_SECONDS (default 60) of silence (a turn to cancel)

A request for strict structured output (Responses `text.format`, Chat Completions
`response_format.json_schema`, `type: "json_schema"`, `strict: true`) whose schema OpenAI's
strict mode refuses gets OpenAI's HTTP 400 (openai_strict.py), whatever the scenario: the
check is in the routing, so a subclass of Handler gets it too (and may override
`schema_refused` to see it).

Every request is appended as one JSON line to the file named by MOCK_LOG, when set.
"""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openai_strict  # noqa: E402

# Distinctive values the fakes substitute.
REPLY = "MOCK-REPLY-4F7: the mock model says hello."
INPUT_TOKENS = 4321
OUTPUT_TOKENS = 765
CACHED_TOKENS = 98
# Gemini's side requests (generateContent, not streamed).
SIDE_INPUT_TOKENS = 11
SIDE_OUTPUT_TOKENS = 2
STRUCTURED = {"verdict": "MOCK-REPLY-4F7", "count": 3}
WRITTEN_FILE = "mock-written.txt"
WRITTEN_TEXT = "written by the mock model\n"
RESET_IN = 3600
# The `denied` scenario's tool calls, in order: (kind, what); a path is relative to the cwd.
DENIED_ACTIONS = [
    ("write", WRITTEN_FILE),
    ("write", ".git/mock-written.txt"),
    ("write", "../mock-outside.txt"),
    ("shell", "echo from-shell > ../mock-outside-shell.txt"),
    ("shell", "git add -A && git commit -q -m x"),
    # An ordinary failure, no refusal: failing tests.
    ("shell", "echo 'FAILED test_mean'; exit 1"),
]
# The ACP captures' tool calls: a write, a commit a policy allows, a push it denies.
ACP_EDIT_ACTIONS = [
    ("write", "notes.txt"),
    ("shell", "git add -A && git commit -q -m 'add notes'"),
    ("shell", "git push origin HEAD"),
]
# The tool calls of each scenario that makes them.
ACTIONS = {
    "denied": DENIED_ACTIONS,
    "acp_edit": ACP_EDIT_ACTIONS,
    "acp_read": [("read", "README.md")],
    # A write in the cwd, then the commit: nothing out of the cwd (a test's cwd may be in /tmp,
    # which codex's workspace-write sandbox lets it write).
    "commit": [DENIED_ACTIONS[0], DENIED_ACTIONS[4]],
}

LOCK = threading.Lock()


def log(entry):
    path = os.environ.get("MOCK_LOG")
    if not path:
        return
    with LOCK, open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def scenario_of(path):
    if path.startswith("/s/"):
        rest = path[3:]
        name, _, tail = rest.partition("/")
        return name, "/" + tail
    file = os.environ.get("MOCK_SCENARIO_FILE")
    if file and os.path.exists(file):
        with open(file, encoding="utf-8") as f:
            words = f.read().split()
        if words:
            return words[0], path
    return os.environ.get("MOCK_SCENARIO", "ok"), path


def path_param(schema, fallback):
    """The name of a tool's path parameter in its JSON schema (the first property whose name
    holds "path"), else `fallback`."""
    props = (schema or {}).get("properties") or {}
    return next((k for k in props if "path" in k.lower()), fallback)


def strict_request(bare, body):
    """(api, name, schema) when the request asks for strict json_schema structured output."""
    if not isinstance(body, dict):
        return None
    if bare.endswith("/responses"):
        fmt = (body.get("text") or {}).get("format") or {}
        api = "responses"
    elif bare.endswith("/chat/completions"):
        rf = body.get("response_format") or {}
        fmt = dict(rf.get("json_schema") or {}, type=rf.get("type"))
        api = "chat"
    else:
        return None
    if fmt.get("type") == "json_schema" and fmt.get("strict") is True:
        return api, fmt.get("name", ""), fmt.get("schema")
    return None


def schema_properties_answer(schema):
    """A value that fits a (simple) JSON schema, preferring STRUCTURED's fields."""
    if not isinstance(schema, dict):
        return STRUCTURED
    props = schema.get("properties")
    if not isinstance(props, dict):
        return STRUCTURED
    out = {}
    for key, sub in props.items():
        kind = sub.get("type") if isinstance(sub, dict) else None
        kind = kind.lower() if isinstance(kind, str) else kind
        if key in STRUCTURED:
            out[key] = STRUCTURED[key]
        elif kind in ("integer", "number"):
            out[key] = 3
        elif kind == "boolean":
            out[key] = True
        elif kind == "array":
            out[key] = []
        elif kind == "object":
            out[key] = {}
        else:
            out[key] = REPLY
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mock-api/1"

    def log_message(self, fmt, *args):  # quiet
        pass

    # ---- plumbing -------------------------------------------------------------------------

    def body(self):
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        if self.headers.get("content-encoding") == "gzip":
            import gzip

            raw = gzip.decompress(raw)
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return {"_raw": raw.decode("utf-8", "replace")}

    def send_json(self, status, obj, headers=(), indent=None):
        data = json.dumps(obj, indent=indent).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_sse(self, headers=()):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("connection", "close")
        self.close_connection = True
        self.end_headers()

    def sse(self, data, event=None):
        chunk = ""
        if event:
            chunk += f"event: {event}\n"
        chunk += "data: " + json.dumps(data) + "\n\n"
        self.wfile.write(chunk.encode())
        self.wfile.flush()

    def do_GET(self):
        self.route("GET", {})

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        self.route("POST", self.body())

    def route(self, method, body):
        scenario, path = scenario_of(self.path)
        bare = path.split("?")[0]
        log(
            {
                "time": time.time(),
                "method": method,
                "path": self.path,
                "scenario": scenario,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
        )
        if scenario == "slow" and method == "POST":
            time.sleep(float(os.environ.get("MOCK_SLOW_SECONDS", "60")))
        strict = strict_request(bare, body) if method == "POST" else None
        refusal = strict and openai_strict.check(strict[2], strict[1], strict[0])
        if refusal:
            self.schema_refused(strict[0], body, refusal)
            # OpenAI's error bodies are indented by 2 (the raw bodies quoted in the issues).
            return self.send_json(refusal[0], refusal[1], [("x-request-id", "req_mock")], indent=2)
        if bare.endswith("/messages/count_tokens"):
            return self.send_json(200, {"input_tokens": INPUT_TOKENS})
        if bare.endswith("/messages"):
            return self.anthropic(scenario, body)
        if bare.endswith("/responses"):
            return self.openai(scenario, body)
        if bare.endswith("/chat/completions"):
            return self.chat(scenario, body)
        if bare.endswith("/models") and method == "GET":
            return self.send_json(200, {"object": "list", "data": [], "models": []})
        if ":countTokens" in bare:
            return self.send_json(200, {"totalTokens": INPUT_TOKENS})
        if ":streamGenerateContent" in bare or ":generateContent" in bare:
            model = bare.rsplit("/", 1)[-1].split(":")[0]
            return self.gemini(scenario, body, model, ":streamGenerateContent" in bare)
        self.send_json(404, {"error": {"message": f"mock: no route for {method} {path}"}})

    def schema_refused(self, api, body, refusal):
        """Called before the 400 refusing a strict schema is sent (a hook for subclasses)."""

    # ---- Anthropic ------------------------------------------------------------------------

    def anthropic_error(self, scenario):
        rid = "req_011MOCKREQUEST0000000001"
        if scenario == "server_error":
            status, kind, message, headers = 500, "api_error", "Internal server error", []
        elif scenario == "rate_limit":
            reset = int(time.time()) + RESET_IN
            status, kind = 429, "rate_limit_error"
            message = "This request would exceed your account's rate limit. Please try again later."
            headers = [
                ("retry-after", str(RESET_IN)),
                ("anthropic-ratelimit-unified-status", "rejected"),
                ("anthropic-ratelimit-unified-reset", str(reset)),
                ("anthropic-ratelimit-unified-representative-claim", "five_hour"),
                ("anthropic-ratelimit-unified-5h-status", "rejected"),
                ("anthropic-ratelimit-unified-5h-reset", str(reset)),
                ("anthropic-ratelimit-unified-5h-utilization", "1.0"),
                ("anthropic-ratelimit-unified-fallback", "unavailable"),
                ("anthropic-ratelimit-unified-overage-status", "rejected"),
                ("anthropic-ratelimit-unified-overage-disabled-reason", "org_level_disabled"),
            ]
        elif scenario == "overloaded":
            status, kind, message, headers = 529, "overloaded_error", "Overloaded", []
        elif scenario == "invalid_key":
            status, kind, message, headers = 401, "authentication_error", "invalid x-api-key", []
        else:
            return False
        headers.append(("request-id", rid))
        headers.append(("x-should-retry", "true" if status >= 500 or status == 429 else "false"))
        self.send_json(
            status,
            {"type": "error", "error": {"type": kind, "message": message}, "request_id": rid},
            headers,
        )
        return True

    def anthropic(self, scenario, body):
        if self.anthropic_error(scenario):
            return
        model = body.get("model", "claude-mock")
        tools = {t.get("name"): t for t in body.get("tools") or [] if isinstance(t, dict)}
        messages = body.get("messages") or []
        had_result = any(
            isinstance(m.get("content"), list)
            and any(isinstance(c, dict) and c.get("type") == "tool_result" for c in m["content"])
            for m in messages
            if isinstance(m, dict)
        )
        content = [{"type": "text", "text": REPLY}]
        stop = "end_turn"
        results = sum(
            1
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("content"), list)
            for c in m["content"]
            if isinstance(c, dict) and c.get("type") == "tool_result"
        )
        actions = ACTIONS.get(scenario, [])
        # A side request (title, quota check...) without tools gets the plain answer.
        if actions and "Bash" in tools and results < len(actions):
            kind, what = actions[results]
            import re

            # Claude states its cwd in the system prompt or, under the Agent SDK, a message.
            m = re.search(r"Primary working directory:\s*(/[^\s\"<\\]+)", json.dumps(body))
            cwd = m.group(1) if m else os.environ.get("MOCK_WRITE_DIR") or "."
            if kind == "write":
                name, args = "Write", {"file_path": os.path.normpath(os.path.join(cwd, what)), "content": WRITTEN_TEXT}
            elif kind == "read":
                name, args = "Read", {"file_path": os.path.normpath(os.path.join(cwd, what))}
            else:
                name, args = "Bash", {"command": what, "description": what}
            content = [
                {
                    "type": "tool_use",
                    "id": "toolu_01MOCKACTION%015d" % results,
                    "name": name,
                    "input": args,
                }
            ]
            stop = "tool_use"
        elif scenario == "structured" and "StructuredOutput" in tools and not had_result:
            schema = tools["StructuredOutput"].get("input_schema")
            content = [
                {
                    "type": "tool_use",
                    "id": "toolu_01MOCKSTRUCTURED000000001",
                    "name": "StructuredOutput",
                    "input": schema_properties_answer(schema),
                }
            ]
            stop = "tool_use"
        elif scenario == "write" and "Write" in tools and not had_result:
            cwd_file = os.path.join(os.environ.get("MOCK_WRITE_DIR", ""), WRITTEN_FILE)
            content = [
                {"type": "text", "text": "I will write the file."},
                {
                    "type": "tool_use",
                    "id": "toolu_01MOCKWRITE00000000000001",
                    "name": "Write",
                    "input": {"file_path": self.write_path(body, cwd_file), "content": WRITTEN_TEXT},
                },
            ]
            stop = "tool_use"
        usage = {
            "input_tokens": INPUT_TOKENS,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": CACHED_TOKENS,
            "output_tokens": OUTPUT_TOKENS,
            "service_tier": "standard",
        }
        msg_id = "msg_01MOCKMESSAGE0000000000001"
        if not body.get("stream"):
            return self.send_json(
                200,
                {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                },
                [("request-id", "req_011MOCKREQUEST0000000002")],
            )
        self.start_sse([("request-id", "req_011MOCKREQUEST0000000002")])
        start_usage = dict(usage, output_tokens=1)
        self.sse(
            {
                "type": "message_start",
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
            "message_start",
        )
        for i, block in enumerate(content):
            if block["type"] == "text":
                self.sse(
                    {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                    "content_block_start",
                )
                self.sse({"type": "ping"}, "ping")
                self.sse(
                    {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": block["text"]}},
                    "content_block_delta",
                )
            else:
                self.sse(
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}},
                    },
                    "content_block_start",
                )
                self.sse(
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                    },
                    "content_block_delta",
                )
            self.sse({"type": "content_block_stop", "index": i}, "content_block_stop")
        self.sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {
                    "input_tokens": INPUT_TOKENS,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": CACHED_TOKENS,
                    "output_tokens": OUTPUT_TOKENS,
                },
            },
            "message_delta",
        )
        self.sse({"type": "message_stop"}, "message_stop")

    def write_path(self, body, fallback):
        """The file to write: in the cwd the CLI states in its system prompt, else `fallback`."""
        import re

        text = json.dumps(body.get("system", "")) + json.dumps(body.get("instructions", ""))
        text += json.dumps(body.get("systemInstruction", ""))
        text += json.dumps(body.get("input", ""))
        m = re.search(r"(?:Primary working directory|Working directory|<cwd>|current working directory[^/]*?)\s*:?\s*(/[^\s\"<\\]+)", text)
        if m:
            return m.group(1).rstrip(".") + "/" + WRITTEN_FILE
        return fallback or WRITTEN_FILE

    def cwd_of(self, body):
        """The CLI's cwd: codex's `<cwd>` element, else as `write_path` finds it."""
        import re

        m = re.search(r"<cwd>(/[^<]+)</cwd>", json.dumps(body.get("input", "")).replace("\\n", "\n"))
        if m:
            return m.group(1)
        fallback = os.path.join(os.environ.get("MOCK_WRITE_DIR", ""), WRITTEN_FILE)
        return os.path.dirname(self.write_path(body, fallback))

    # ---- OpenAI Responses -----------------------------------------------------------------

    def openai_error(self, scenario):
        """Answers an OpenAI error scenario (Responses and Chat Completions); False if none."""
        errors = {
            "server_error": (
                500,
                {
                    "message": "The server had an error while processing your request. Sorry about that!",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                },
                [],
            ),
            "rate_limit": (
                429,
                {
                    "message": "Rate limit reached for gpt-5 in organization org-mock on tokens per min (TPM): "
                    "Limit 30000, Used 30000, Requested 4321. Please try again in 20s. Visit "
                    "https://platform.openai.com/account/rate-limits to learn more.",
                    "type": "tokens",
                    "param": None,
                    "code": "rate_limit_exceeded",
                },
                [("retry-after", "20"), ("x-ratelimit-reset-tokens", "20s")],
            ),
            "overloaded": (
                503,
                {
                    "message": "The engine is currently overloaded, please try again later",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                },
                [],
            ),
            "invalid_key": (
                401,
                {
                    "message": "Incorrect API key provided: mock-key. You can find your API key at "
                    "https://platform.openai.com/account/api-keys.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                },
                [],
            ),
        }
        if scenario == "usage_limit":
            # The ChatGPT plan's limit, as the Codex backend sends it.
            reset = int(time.time()) + RESET_IN
            err = {
                "type": "usage_limit_reached",
                "message": "The usage limit has been reached",
                "plan_type": "plus",
                "resets_at": reset,
                "resets_in_seconds": RESET_IN,
            }
            errors[scenario] = (429, err, [])
        if scenario not in errors:
            return False
        status, err, headers = errors[scenario]
        self.send_json(status, {"error": err}, headers + [("x-request-id", "req_mock")])
        return True

    def openai(self, scenario, body):
        if self.openai_error(scenario):
            return
        model = body.get("model", "gpt-mock")
        inputs = body.get("input") or []
        had_result = any(
            isinstance(i, dict) and i.get("type") in ("function_call_output", "custom_tool_call_output")
            for i in inputs
        )
        tools = {}

        def collect(ts):
            for t in ts or []:
                if isinstance(t, dict):
                    tools[t.get("name") or t.get("type")] = t
                    collect(t.get("tools"))

        collect(body.get("tools"))
        # Newer codex sends its tools as an `additional_tools` input item.
        for i in inputs:
            if isinstance(i, dict) and i.get("type") == "additional_tools":
                collect(i.get("tools"))
        text = REPLY
        fmt = (body.get("text") or {}).get("format") or {}
        if scenario == "structured" or fmt.get("type") == "json_schema":
            text = json.dumps(schema_properties_answer(fmt.get("schema")))
        items = []
        results = sum(
            1
            for i in inputs
            if isinstance(i, dict) and i.get("type") in ("function_call_output", "custom_tool_call_output")
        )
        actions = ACTIONS.get(scenario, [])
        if results < len(actions):
            items.append(self.codex_denied_call(actions[results], results, tools, self.cwd_of(body)))
        elif scenario == "write" and not had_result:
            patch = "*** Begin Patch\n*** Add File: " + WRITTEN_FILE + "\n+" + WRITTEN_TEXT + "*** End Patch\n"
            if "exec" in tools and tools["exec"].get("type") == "custom":
                # The code-mode tool: a script calling the nested tools; it reports each
                # outcome. The patch edits a file, the command tests the shell sandbox.
                script = (
                    "try { text(JSON.stringify(await tools.apply_patch(" + json.dumps(patch) + "))); }"
                    " catch (e) { text('apply_patch failed: ' + e); }\n"
                    "try { text(JSON.stringify(await tools.exec_command({cmd: "
                    + json.dumps("echo from-shell > mock-shell.txt") + "}))); }"
                    " catch (e) { text('exec_command failed: ' + e); }\n"
                )
                items.append(
                    {
                        "type": "custom_tool_call",
                        "id": "ctc_mock1",
                        "status": "completed",
                        "call_id": "call_mockwrite1",
                        "name": "exec",
                        "input": script,
                    }
                )
            elif "apply_patch" in tools and tools["apply_patch"].get("type") == "custom":
                items.append(
                    {
                        "type": "custom_tool_call",
                        "id": "ctc_mock1",
                        "status": "completed",
                        "call_id": "call_mockwrite1",
                        "name": "apply_patch",
                        "input": "*** Begin Patch\n*** Add File: " + WRITTEN_FILE + "\n+" + WRITTEN_TEXT
                        + "*** End Patch\n",
                    }
                )
            elif "apply_patch" in tools:
                items.append(
                    {
                        "type": "function_call",
                        "id": "fc_mock1",
                        "status": "completed",
                        "call_id": "call_mockwrite1",
                        "name": "apply_patch",
                        "arguments": json.dumps(
                            {"input": "*** Begin Patch\n*** Add File: " + WRITTEN_FILE + "\n+" + WRITTEN_TEXT
                             + "*** End Patch\n"}
                        ),
                    }
                )
            else:
                name = "shell" if "shell" in tools else ("exec_command" if "exec_command" in tools else "shell")
                args = (
                    {"cmd": f"printf 'written by the mock model\\n' > {WRITTEN_FILE}"}
                    if name == "exec_command"
                    else {"command": ["bash", "-lc", f"printf 'written by the mock model\\n' > {WRITTEN_FILE}"]}
                )
                items.append(
                    {
                        "type": "function_call",
                        "id": "fc_mock1",
                        "status": "completed",
                        "call_id": "call_mockwrite1",
                        "name": name,
                        "arguments": json.dumps(args),
                    }
                )
        else:
            items.append(
                {
                    "type": "message",
                    "id": "msg_mock1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        usage = {
            "input_tokens": INPUT_TOKENS,
            "input_tokens_details": {"cached_tokens": CACHED_TOKENS},
            "output_tokens": OUTPUT_TOKENS,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
        }
        if results < len(actions):
            # The tool calls count nothing: the totals are the one answer's, as in `ok`.
            usage = {k: {kk: 0 for kk in v} if isinstance(v, dict) else 0 for k, v in usage.items()}
        return self.responses_reply(body, items, usage, model, "resp_mock1")

    def responses_reply(self, body, items, usage, model, rid):
        """Answers a Responses request with these output items and usage: a whole response,
        or its event stream when the request asks for one."""
        resp = {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": model,
            "output": [],
        }
        if not body.get("stream"):
            return self.send_json(200, dict(resp, status="completed", output=items, usage=usage))
        self.start_sse()
        seq = 0

        def ev(kind, **data):
            nonlocal seq
            seq += 1
            self.sse(dict({"type": kind, "sequence_number": seq}, **data), kind)

        ev("response.created", response=resp)
        ev("response.in_progress", response=resp)
        for i, item in enumerate(items):
            ev("response.output_item.added", output_index=i, item=dict(item, status="in_progress"))
            if item["type"] == "message":
                t = item["content"][0]["text"]
                ev("response.output_text.delta", item_id=item["id"], output_index=i, content_index=0, delta=t)
                ev("response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=t)
            ev("response.output_item.done", output_index=i, item=item)
        ev("response.completed", response=dict(resp, status="completed", output=items, usage=usage))

    @staticmethod
    def codex_denied_call(action, step, tools, cwd):
        """An action (kind, what) of ACTIONS as codex's tool call number `step`: in code mode,
        an `exec` script calling the nested tool and reporting its result (or its error)."""
        kind, what = action
        call_id = "call_mockdenied%d" % step
        if kind == "write":
            path = os.path.normpath(os.path.join(cwd, what))
            patch = "*** Begin Patch\n*** Add File: " + path + "\n+" + WRITTEN_TEXT + "*** End Patch\n"
            nested, arg = "apply_patch", patch
        else:
            nested, arg = "exec_command", {"cmd": what}
        if "exec" in tools and tools["exec"].get("type") == "custom":
            script = (
                "try { text(JSON.stringify(await tools." + nested + "(" + json.dumps(arg) + "))); }"
                " catch (e) { text('" + nested + " failed: ' + e); }\n"
            )
            return {
                "type": "custom_tool_call",
                "id": "ctc_mockdenied%d" % step,
                "status": "completed",
                "call_id": call_id,
                "name": "exec",
                "input": script,
            }
        if nested == "apply_patch" and tools.get("apply_patch", {}).get("type") == "custom":
            return {
                "type": "custom_tool_call",
                "id": "ctc_mockdenied%d" % step,
                "status": "completed",
                "call_id": call_id,
                "name": "apply_patch",
                "input": arg,
            }
        if nested == "apply_patch" and "apply_patch" in tools:
            name, args = "apply_patch", {"input": arg}
        elif "exec_command" in tools:
            cmd = arg["cmd"] if nested == "exec_command" else "apply_patch <<'PATCH'\n" + arg + "PATCH\n"
            name, args = "exec_command", {"cmd": cmd}
        else:
            cmd = arg["cmd"] if nested == "exec_command" else "apply_patch <<'PATCH'\n" + arg + "PATCH\n"
            name, args = "shell", {"command": ["bash", "-lc", cmd]}
        return {
            "type": "function_call",
            "id": "fc_mockdenied%d" % step,
            "status": "completed",
            "call_id": call_id,
            "name": name,
            "arguments": json.dumps(args),
        }

    # ---- OpenAI Chat Completions ----------------------------------------------------------

    # The tools of the agent CLIs that speak Chat Completions, by the CLI's user agent:
    # (write tool, its path argument, its content argument, shell tool, its command argument).
    CHAT_TOOLS = {
        "QwenCode": ("write_file", "file_path", "content", "run_shell_command", "command"),
        "opencode": ("write", "filePath", "content", "bash", "command"),
    }

    # Their file-read tools, by their write tool's name.
    CHAT_READ = {"write_file": "read_file", "write": "read"}

    # Side requests of the CLIs (qwen's memory extraction, opencode's session title),
    # recognized by their system prompt: a plain answer, whatever the scenario.
    SIDE_REQUESTS = ("managed memory extraction subagent", "You are a title generator")

    def chat(self, scenario, body):
        if self.openai_error(scenario):
            return
        rf = body.get("response_format") or {}
        text = REPLY
        if scenario == "structured" or rf.get("type") == "json_schema":
            text = json.dumps(schema_properties_answer((rf.get("json_schema") or {}).get("schema")))
        messages = body.get("messages") or []
        system = json.dumps([m.get("content") for m in messages if m.get("role") == "system"])
        tools = {
            (t.get("function") or {}).get("name"): (t.get("function") or {})
            for t in body.get("tools") or []
            if isinstance(t, dict)
        }
        results = sum(1 for m in messages if m.get("role") == "tool")
        side = any(marker in system for marker in self.SIDE_REQUESTS)
        call = None
        if not side:
            agent = self.headers.get("user-agent", "")
            names = next((v for k, v in self.CHAT_TOOLS.items() if agent.startswith(k)), None)
            actions = ACTIONS.get(scenario) or ([DENIED_ACTIONS[0]] if scenario == "write" else [])
            if "structured_output" in tools and results == 0:
                # qwen's --json-schema: its synthetic tool, called with the answer.
                call = ("structured_output", schema_properties_answer(
                    (tools["structured_output"].get("parameters") or {})))
            elif names and results < len(actions):
                # The tool calls, whether or not the CLI offers the tool.
                kind, what = actions[results]
                write, path_arg, content_arg, shell, command_arg = names
                if kind == "read":
                    read = self.CHAT_READ.get(write, "read")
                    path = os.path.normpath(os.path.join(self.chat_cwd(json.dumps(messages)), what))
                    call = (read, {path_param(tools.get(read, {}).get("parameters"), path_arg): path})
                elif kind == "write":
                    path = os.path.normpath(os.path.join(self.chat_cwd(json.dumps(messages)), what))
                    call = (write, {path_arg: path, content_arg: WRITTEN_TEXT})
                else:
                    call = (shell, {command_arg: what})
        usage = {
            "prompt_tokens": INPUT_TOKENS,
            "completion_tokens": OUTPUT_TOKENS,
            "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
            "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
        }
        resp = {"id": "chatcmpl-mock1", "created": int(time.time()), "model": body.get("model", "gpt-mock")}
        message = {"role": "assistant", "content": text, "refusal": None}
        finish = "stop"
        if call:
            name, args = call
            message = {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_mockchat%d" % results,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
            finish = "tool_calls"
            if name != "structured_output":
                # The tool calls count nothing: the totals are the answers', as in `ok`.
                usage = {k: {kk: 0 for kk in v} if isinstance(v, dict) else 0 for k, v in usage.items()}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            return self.send_json(200, dict(resp, object="chat.completion", choices=[choice], usage=usage))
        self.start_sse()
        for delta, end in ((message, None), ({}, finish)):
            choice = {"index": 0, "delta": delta, "finish_reason": end, "logprobs": None}
            self.sse(dict(resp, object="chat.completion.chunk", choices=[choice]))
        if (body.get("stream_options") or {}).get("include_usage"):
            self.sse(dict(resp, object="chat.completion.chunk", choices=[], usage=usage))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def chat_cwd(self, text):
        """The CLI's cwd as its prompts state it (opencode: "Working directory: ...", qwen:
        "I'm currently working in the directory: ..."), else MOCK_WRITE_DIR."""
        import re

        m = re.search(
            r"(?:Working directory|working in the directory)\s*:?\s*(/[^\s\"<\\]+)",
            text,
        )
        if m:
            return m.group(1).rstrip(".")
        return os.environ.get("MOCK_WRITE_DIR") or "."

    # ---- Gemini ---------------------------------------------------------------------------

    def gemini(self, scenario, body, model, stream):
        errors = {
            "server_error": (
                500,
                "An internal error has occurred. Please retry or report in "
                "https://developers.generativeai.google/guide/troubleshooting",
                "INTERNAL",
                None,
            ),
            "rate_limit": (
                429,
                "You exceeded your current quota, please check your plan and billing details. For more "
                "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. "
                "To monitor your current usage, head to: https://ai.dev/usage?tab=rate-limit. \n* Quota "
                "exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, "
                "limit: 2, model: " + model + "\nPlease retry in 45.123456789s.",
                "RESOURCE_EXHAUSTED",
                [
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [
                            {
                                "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                                "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                                "quotaDimensions": {"location": "global", "model": model},
                                "quotaValue": "2",
                            }
                        ],
                    },
                    {"@type": "type.googleapis.com/google.rpc.Help", "links": [
                        {"description": "Learn more about Gemini API quotas",
                         "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "45s"},
                ],
            ),
            "overloaded": (503, "The model is overloaded. Please try again later.", "UNAVAILABLE", None),
            "invalid_key": (
                400,
                "API key not valid. Please pass a valid API key.",
                "INVALID_ARGUMENT",
                [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "API_KEY_INVALID",
                        "domain": "googleapis.com",
                        "metadata": {"service": "generativelanguage.googleapis.com"},
                    },
                    {
                        "@type": "type.googleapis.com/google.rpc.LocalizedMessage",
                        "locale": "en-US",
                        "message": "API key not valid. Please pass a valid API key.",
                    },
                ],
            ),
        }
        if scenario in errors:
            status, message, st, details = errors[scenario]
            err = {"code": status, "message": message, "status": st}
            if details:
                err["details"] = details
            return self.send_json(status, {"error": err})
        contents = body.get("contents") or []
        had_result = any(
            isinstance(p, dict) and "functionResponse" in p
            for c in contents
            if isinstance(c, dict)
            for p in c.get("parts") or []
        )
        decls = set()
        for t in body.get("tools") or []:
            for d in (t or {}).get("functionDeclarations") or []:
                decls.add(d.get("name"))
        gen = body.get("generationConfig") or body.get("config") or {}
        if gen.get("responseMimeType") == "application/json" or gen.get("responseJsonSchema") or gen.get("responseSchema"):
            schema = gen.get("responseJsonSchema") or gen.get("responseSchema") or {}
            answer = schema_properties_answer(schema)
            # The model router's classifier asks for a model choice.
            if "model_choice" in answer:
                answer["model_choice"] = "flash"
            if "next_speaker" in answer:
                answer["next_speaker"] = "user"
            parts = [{"text": json.dumps(answer)}]
        elif self.gemini_results(contents) < len(ACTIONS.get(scenario, [])):
            kind, what = ACTIONS[scenario][self.gemini_results(contents)]
            cwd = self.cwd_of(body)
            if kind == "write":
                call = {"name": "write_file", "args": {"file_path": os.path.normpath(os.path.join(cwd, what)), "content": WRITTEN_TEXT}}
            elif kind == "read":
                params = next(
                    (d.get("parametersJsonSchema") or d.get("parameters")
                     for t in body.get("tools") or [] for d in (t or {}).get("functionDeclarations") or []
                     if d.get("name") == "read_file"),
                    None,
                )
                call = {"name": "read_file", "args": {path_param(params, "file_path"): os.path.normpath(os.path.join(cwd, what))}}
            else:
                call = {"name": "run_shell_command", "args": {"command": what, "description": what}}
            parts = [{"functionCall": call}]
        elif scenario == "write" and not had_result and "write_file" in decls:
            path = self.write_path(body, os.path.join(os.environ.get("MOCK_WRITE_DIR", ""), WRITTEN_FILE))
            parts = [{"functionCall": {"name": "write_file", "args": {"file_path": path, "content": WRITTEN_TEXT}}}]
        elif scenario == "structured":
            parts = [{"text": json.dumps(STRUCTURED)}]
        else:
            parts = [{"text": REPLY}]
        usage = {
            "promptTokenCount": INPUT_TOKENS,
            "candidatesTokenCount": OUTPUT_TOKENS,
            "totalTokenCount": INPUT_TOKENS + OUTPUT_TOKENS,
            "cachedContentTokenCount": CACHED_TOKENS,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": INPUT_TOKENS}],
        }
        if "functionCall" in parts[0] and scenario in ACTIONS:
            # The tool calls count nothing: the totals are the one answer's, as in `ok`.
            usage = {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0}
        if not stream:
            # Side requests (the model router's classifier...): their own small usage.
            usage = {
                "promptTokenCount": SIDE_INPUT_TOKENS,
                "candidatesTokenCount": SIDE_OUTPUT_TOKENS,
                "totalTokenCount": SIDE_INPUT_TOKENS + SIDE_OUTPUT_TOKENS,
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": SIDE_INPUT_TOKENS}],
            }
        chunk = {
            "candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": "mockResponseId0001",
        }
        if not stream:
            return self.send_json(200, chunk)
        self.start_sse()
        self.sse(chunk)

    @staticmethod
    def gemini_results(contents):
        """How many tool results a Gemini conversation holds."""
        return sum(
            1
            for c in contents
            if isinstance(c, dict)
            for p in c.get("parts") or []
            if isinstance(p, dict) and "functionResponse" in p
        )


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
