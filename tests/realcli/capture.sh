#!/bin/sh
# Runs the real claude, codex, gemini, qwen and opencode CLIs against
# tests/realcli/mock_api.py, the way
# ralph-flow calls them, and stores what they print as the fixtures the fakes replay:
#   tests/fakes/captures/<cli>/<case>.stdout .stderr .exit .argv (.files: the cwd after;
#   .repo, in a git repository: its commits, what was written in .git and next to the cwd)
#   tests/fakes/captures/VERSIONS
#
# Usage: tests/realcli/capture.sh [REALCLI_DIR [CASE...]]
#   REALCLI_DIR  where tests/realcli/install.sh installed the CLIs (default target/realcli)
#   CASE         only these cases, as <cli>/<case> (default: all)
#
# Each case runs in a fresh HOME and cwd (under $CAPTURE_WORK, default
# ~/.cache/ralph-flow-realcli-capture), with no environment
# but PATH, HOME and the CLI's own settings, against the mock on 127.0.0.1 only. Noise is
# normalized: the work directory becomes /WORK, the install directory /CLI, the mock's port
# MOCKPORT, and the session id (claude session_id, codex thread_id, gemini and qwen
# session_id, opencode sessionID) 00000000-0000-4000-8000-000000000000; opencode's
# timestamps, part ids and snapshot hashes too.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/target/realcli}
[ $# -gt 0 ] && shift
dir=$(cd "$dir" && pwd)
bin=$dir/node_modules/.bin
out=$root/tests/fakes/captures
# Outside any git repository (codex and gemini look for one above the cwd), and outside
# the temporary directory (codex warns when its home is there).
work=${CAPTURE_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/ralph-flow-realcli-capture}
only="$*"

for c in claude codex gemini qwen opencode; do
    if [ ! -x "$bin/$c" ]; then
        echo "capture: $bin/$c not found: run tests/realcli/install.sh first" >&2
        exit 1
    fi
done

rm -rf "$work"
mkdir -p "$work" "$out/claude" "$out/codex" "$out/gemini" "$out/qwen" "$out/opencode"
if git -C "$work" rev-parse --git-dir >/dev/null 2>&1; then
    echo "capture: $work is inside a git repository: set CAPTURE_WORK elsewhere" >&2
    exit 1
fi
MOCK_LOG=$work/mock.log python3 "$root/tests/realcli/mock_api.py" 0 >"$work/port" &
mock=$!
trap 'kill $mock 2>/dev/null || true' EXIT INT TERM
i=0
while [ ! -s "$work/port" ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
port=$(cat "$work/port")
base=http://127.0.0.1:$port

SYSPATH=$(dirname "$(command -v node)"):/usr/local/bin:/usr/bin:/bin
SCHEMA='{"type":"object","properties":{"verdict":{"type":"string"},"count":{"type":"integer"}},"required":["verdict","count"],"additionalProperties":false}'
# What the real CLIs refuse: claude's Ajv (draft-07, strict mode), OpenAI's strict mode.
SCHEMA_2020='{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"verdict":{"type":"string"}},"required":["verdict"]}'
SCHEMA_UNKNOWN='{"type":"object","properties":{"verdict":{"type":"string"}},"foo":1}'
SCHEMA_LOOSE='{"type":"object","properties":{"verdict":{"type":"string"},"count":{"type":"integer"}},"required":["verdict","count"]}'

{
    echo "claude $("$bin/claude" --version 2>/dev/null | head -1)"
    echo "codex $(HOME=$work CODEX_HOME=$work "$bin/codex" --version 2>/dev/null | tail -1)"
    echo "gemini $(HOME=$work "$bin/gemini" --version 2>/dev/null | tail -1)"
    echo "qwen $(HOME=$work "$bin/qwen" --version 2>/dev/null | tail -1)"
    echo "opencode $(HOME=$work "$bin/opencode" --version 2>/dev/null | tail -1)"
    echo "node $(node --version)"
} >"$out/VERSIONS"

# Replaces the noise in a captured file, in place.
normalize() {
    python3 - "$1" "$work" "$dir" "$port" <<'PY'
import re, sys
path, work, cli, port = sys.argv[1:]
text = open(path, encoding="utf-8", errors="surrogateescape").read()
for key in ("session_id", "thread_id"):
    for m in re.finditer(r'"%s"\s*:\s*"([0-9a-f-]{36})"' % key, text):
        text = text.replace(m.group(1), "00000000-0000-4000-8000-000000000000")
# opencode: its session id (ses_...), and what differs from run to run.
for m in re.finditer(r'"sessionID"\s*:\s*"(ses_[0-9A-Za-z]+)"', text):
    text = text.replace(m.group(1), "00000000-0000-4000-8000-000000000000")
text = re.sub(r'"(id|messageID)":"(prt|msg)_[0-9A-Za-z]+"', lambda m: '"%s":"%s_MOCK"' % (m.group(1), m.group(2)), text)
text = re.sub(r'"(timestamp|start|end|created|completed)":\d{13}', lambda m: '"%s":1700000000000' % m.group(1), text)
text = re.sub(r'"snapshot":"[0-9a-f]{40}"', '"snapshot":"0000000000000000000000000000000000000000"', text)
text = text.replace(work, "/WORK").replace(cli, "/CLI").replace("127.0.0.1:" + port, "127.0.0.1:MOCKPORT")
open(path, "w", encoding="utf-8", errors="surrogateescape").write(text)
PY
}

# case CLI NAME SCENARIO CWD(plain|git) [VAR=VALUE...] -- ARGS...
# ARGS are the arguments after the program, as ralph-flow passes them.
run_case() {
    cli=$1 name=$2 scenario=$3 kind=$4
    shift 4
    if [ -n "$only" ]; then
        case " $only " in
        *" $cli/$name "*) ;;
        *) return 0 ;;
        esac
    fi
    envs=
    while [ "$1" != -- ]; do
        envs="$envs $1"
        shift
    done
    shift
    d=$work/$cli-$name
    mkdir -p "$d/home" "$d/cwd"
    if [ "$kind" = git ]; then
        git -C "$d/cwd" init -q
        # An identity in the repository's config: an agent's own commit needs one.
        git -C "$d/cwd" config user.email t@t
        git -C "$d/cwd" config user.name t
        git -C "$d/cwd" commit -q --allow-empty -m init
    fi
    case $cli in
    claude)
        set -- env -i PATH="$SYSPATH" HOME="$d/home" ANTHROPIC_BASE_URL="$base/s/$scenario" \
            ANTHROPIC_API_KEY=sk-ant-mock-key CLAUDE_CODE_MAX_RETRIES=0 \
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 $envs "$bin/claude" "$@"
        ;;
    codex)
        mkdir -p "$d/home/.codex"
        cat >"$d/home/.codex/config.toml" <<EOF
model_provider = "mock"

[model_providers.mock]
name = "mock"
base_url = "$base/s/$scenario/v1"
env_key = "MOCK_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
EOF
        set -- env -i PATH="$SYSPATH" HOME="$d/home" CODEX_HOME="$d/home/.codex" \
            MOCK_API_KEY=mock-key $envs "$bin/codex" "$@"
        ;;
    gemini)
        mkdir -p "$d/home/.gemini"
        printf '%s\n' '{"security":{"auth":{"selectedType":"gemini-api-key"}},"general":{"maxAttempts":1}}' \
            >"$d/home/.gemini/settings.json"
        set -- env -i PATH="$SYSPATH" HOME="$d/home" GEMINI_API_KEY=mock-key \
            GOOGLE_GEMINI_BASE_URL="$base/s/$scenario" $envs "$bin/gemini" "$@"
        ;;
    qwen)
        mkdir -p "$d/home/.qwen"
        # No retries of its own (by default it retries a 429 ten times, a minute apart).
        printf '%s\n' '{"model":{"generationConfig":{"maxRetries":0}}}' >"$d/home/.qwen/settings.json"
        set -- env -i PATH="$SYSPATH" HOME="$d/home" OPENAI_API_KEY=mock-key \
            OPENAI_BASE_URL="$base/s/$scenario/v1" OPENAI_MODEL=qwen-mock $envs "$bin/qwen" "$@"
        ;;
    opencode)
        mkdir -p "$d/home/.config/opencode"
        cat >"$d/home/.config/opencode/opencode.json" <<EOF
{"provider":{"mock":{"npm":"@ai-sdk/openai-compatible","name":"Mock","options":{"baseURL":"$base/s/$scenario/v1","apiKey":"mock-key"},"models":{"mock-model":{"name":"Mock"}}}},"model":"mock/mock-model","autoupdate":false,"share":"disabled"}
EOF
        set -- env -i PATH="$SYSPATH" HOME="$d/home" $envs "$bin/opencode" "$@"
        ;;
    esac
    prompt="Reply with a short greeting."
    if [ "$scenario" = write ]; then
        prompt="Create the file mock-written.txt in the current directory."
    elif [ "$scenario" = denied ]; then
        prompt="Create the file mock-written.txt in the current directory, then commit your work with git."
    fi
    f=$out/$cli/$name
    start=$(date +%s)
    set +e
    (cd "$d/cwd" && printf '%s\n' "$prompt" | MOCK_WRITE_DIR="$d/cwd" timeout 300 "$@" >"$f.stdout" 2>"$f.stderr")
    code=$?
    set -e
    echo "$code" >"$f.exit"
    # The arguments after `env -i VAR=...`: the program (by its name), then its argv.
    seen=
    for a in "$@"; do
        if [ -z "$seen" ]; then
            case $a in "$bin/$cli")
                seen=1
                echo "$cli"
                ;;
            esac
        else
            printf '%s\n' "$a"
        fi
    done >"$f.argv"
    (cd "$d/cwd" && find . -path ./.git -prune -o -type f -print | sort | while read -r p; do
        printf '%s: %s\n' "$p" "$(head -c 200 "$p" | tr '\n' ' ')"
    done) >"$f.files"
    for x in stdout stderr argv files; do
        normalize "$f.$x"
    done
    [ -s "$f.files" ] || rm -f "$f.files"
    if [ "$kind" = git ]; then
        # What reached the repository and the cwd's parent (a write outside the workspace).
        {
            echo "commits: $(git -C "$d/cwd" log --format=%s | tr '\n' ' ')"
            echo "in .git: $(cd "$d/cwd/.git" && ls mock-* 2>/dev/null | tr '\n' ' ')"
            echo "outside: $(cd "$d" && ls mock-* 2>/dev/null | tr '\n' ' ')"
        } >"$f.repo"
    fi
    echo "captured $cli/$name: exit $code in $(($(date +%s) - start))s" >&2
}

# ---- claude: claude -p --output-format json [--model M] [--json-schema S] [ARGS], prompt on stdin
for s in ok server_error rate_limit overloaded invalid_key; do
    run_case claude $s $s plain -- -p --output-format json
done
run_case claude structured structured plain -- -p --output-format json --json-schema "$SCHEMA"
run_case claude schema_draft2020 ok plain -- -p --output-format json --json-schema "$SCHEMA_2020"
run_case claude schema_unknown_keyword ok plain -- -p --output-format json --json-schema "$SCHEMA_UNKNOWN"
run_case claude schema_not_object ok plain -- -p --output-format json --json-schema '[]'
run_case claude write_default write plain -- -p --output-format json
run_case claude write_default_mode write plain -- -p --output-format json --permission-mode default
run_case claude write_accept_edits write plain -- -p --output-format json --permission-mode acceptEdits
run_case claude write_bypass write plain -- -p --output-format json --permission-mode bypassPermissions
run_case claude write_bypass_sandbox write plain IS_SANDBOX=1 -- -p --output-format json --permission-mode bypassPermissions

# ---- codex: codex exec --json [--model M] [ARGS] -, prompt on stdin
run_case codex untrusted ok plain -- exec --json -
run_case codex ok_git ok git -- exec --json -
for s in ok server_error rate_limit overloaded invalid_key usage_limit; do
    run_case codex $s $s plain -- exec --json --skip-git-repo-check -
done
echo "$SCHEMA" >"$work/schema.json"
run_case codex structured structured plain -- exec --json --skip-git-repo-check --output-schema "$work/schema.json" -
# A schema OpenAI's strict mode refuses (no additionalProperties: false): the mock answers
# the 400 OpenAI gives (tests/realcli/openai_strict.py).
echo "$SCHEMA_LOOSE" >"$work/schema-loose.json"
run_case codex schema_refused ok plain -- exec --json --skip-git-repo-check --output-schema "$work/schema-loose.json" -
run_case codex write_default write git -- exec --json -
run_case codex write_read_only write git -- exec --json --sandbox read-only -
run_case codex write_workspace write git -- exec --json --sandbox workspace-write -
run_case codex write_full write git -- exec --json --sandbox danger-full-access -
# The tool calls a sandbox may refuse (mock_api.py DENIED_ACTIONS: writes in the cwd, its
# .git and outside it, a shell write outside it, git add and commit, failing tests), run as
# ralph-flow runs codex for each `permissions`, with the RUST_LOG it sets (the sandbox's
# refusals of commands are logged at WARN only).
CODEX_LOG=RUST_LOG=error,codex_sandboxing::violation=warn
run_case codex denied_read_only denied git "$CODEX_LOG" -- exec --json --skip-git-repo-check --sandbox read-only -
run_case codex denied_workspace denied git "$CODEX_LOG" -- exec --json --skip-git-repo-check --sandbox workspace-write -
run_case codex denied_full denied git "$CODEX_LOG" -- exec --json --skip-git-repo-check --sandbox danger-full-access -

# ---- gemini: gemini [--model M] [ARGS] --output-format json, prompt on stdin
run_case gemini untrusted ok plain -- --output-format json
run_case gemini trust_env ok plain GEMINI_CLI_TRUST_WORKSPACE=true -- --output-format json
for s in ok server_error rate_limit overloaded invalid_key; do
    run_case gemini $s $s plain -- --skip-trust --output-format json
done
run_case gemini ok_model ok plain -- --model gemini-2.5-flash --skip-trust --output-format json
run_case gemini write_default write plain -- --skip-trust --output-format json
run_case gemini write_auto_edit write plain -- --skip-trust --approval-mode auto_edit --output-format json
run_case gemini write_yolo write plain -- --skip-trust --approval-mode yolo --output-format json
# The same tool calls (asked for whether gemini offers the tools or not), as ralph-flow runs
# gemini for each `permissions`.
run_case gemini denied_default denied git GEMINI_CLI_TRUST_WORKSPACE=true -- --approval-mode default --output-format json
run_case gemini denied_auto_edit denied git GEMINI_CLI_TRUST_WORKSPACE=true -- --approval-mode auto_edit --output-format json
run_case gemini denied_yolo denied git GEMINI_CLI_TRUST_WORKSPACE=true -- --approval-mode yolo --output-format json

# ---- qwen: qwen [--model M] --approval-mode MODE [--json-schema S] [ARGS] --output-format json,
# prompt on stdin (headless without a TTY)
for s in ok server_error rate_limit invalid_key; do
    run_case qwen $s $s plain -- --approval-mode default --output-format json
done
run_case qwen structured structured plain -- --approval-mode default --json-schema "$SCHEMA" --output-format json
run_case qwen schema_unknown_keyword ok plain -- --approval-mode default --json-schema "$SCHEMA_UNKNOWN" --output-format json
run_case qwen bad_flag ok plain -- --approval-mode default --no-such-flag --output-format json
run_case qwen write_default write plain -- --approval-mode default --output-format json
run_case qwen write_auto_edit write plain -- --approval-mode auto-edit --output-format json
run_case qwen write_yolo write plain -- --approval-mode yolo --output-format json
run_case qwen denied_default denied git -- --approval-mode default --output-format json
run_case qwen denied_auto_edit denied git -- --approval-mode auto-edit --output-format json
run_case qwen denied_yolo denied git -- --approval-mode yolo --output-format json

# ---- opencode: opencode run --format json [--model M] [ARGS], prompt on stdin, the
# permissions in OPENCODE_PERMISSION as ralph-flow sets them for each `permissions`
OC_READ_ONLY='OPENCODE_PERMISSION={"edit":"deny","bash":"deny","external_directory":"deny"}'
OC_EDIT='OPENCODE_PERMISSION={"edit":"allow","bash":"deny","external_directory":"deny"}'
OC_FULL='OPENCODE_PERMISSION={"*":"allow"}'
for s in ok server_error rate_limit invalid_key; do
    run_case opencode $s $s plain "$OC_READ_ONLY" -- run --format json
done
# No schema flag: the schema is in the prompt (the mock answers the JSON).
run_case opencode structured structured plain "$OC_READ_ONLY" -- run --format json
run_case opencode bad_flag ok plain "$OC_READ_ONLY" -- run --format json --no-such-flag
run_case opencode write_default write plain -- run --format json
run_case opencode write_read_only write plain "$OC_READ_ONLY" -- run --format json
run_case opencode write_edit write plain "$OC_EDIT" -- run --format json
run_case opencode write_full write plain "$OC_FULL" -- run --format json
run_case opencode denied_read_only denied git "$OC_READ_ONLY" -- run --format json
run_case opencode denied_edit denied git "$OC_EDIT" -- run --format json
run_case opencode denied_full denied git "$OC_FULL" -- run --format json

cp "$work/mock.log" "$work/mock.log.keep" 2>/dev/null || true
