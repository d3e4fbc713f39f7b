#!/bin/sh
# One golden-path run of a shipped preset through a real agent CLI against the scripted mock
# of its model API (tests/realcli/scripted_mock.py), as a user would do it: a fresh git
# repository, `ralph-flow init PRESET`, the preset's inputs, `ralph-flow run`, the human gates
# answered with `ralph-flow approve` from another process while the run waits.
#
# Usage: golden.sh CLI PRESET WORK
#   CLI     claude, codex or gemini; or acp: the preset's ACP form (`init PRESET-acp`), its
#           claude agents over the Agent Client Protocol through the real claude-agent-acp,
#           whose policy allows commits and denies pushes. The mock plays the script's ACP
#           variant (SCRIPT_VARIANT=acp), in which the agent also asks to `git push`; the
#           repository has a remote (WORK/remote.git, pushed to before the run) to push to.
#   PRESET  wiggum-review, cairo-driver-reviewer or spider
#   WORK    an empty directory: the repository is WORK/repo, the CLIs' home WORK/home
#
# Environment: RALPH_FLOW (the ralph-flow binary), REALCLI_BIN (the directory of the real
# claude, codex, gemini and claude-agent-acp), GOLDEN_TIMEOUT (seconds the run may take,
# default 120).
#
# Run it offline, in a network namespace with only loopback, as tests/golden_path.rs does:
#   unshare --net --pid --fork --kill-child --mount-proc \
#       sh -c 'ip link set lo up && sh "$0" "$@"' tests/realcli/golden.sh codex spider "$WORK"
#
# Leaves in WORK: run.out and run.err (what `ralph-flow run` printed), exit (its exit code),
# run_id, status.json (`ralph-flow status RUN --json`), gates (the gates it approved, one a
# line), script.log (every model request the mock answered, with the usage it reported),
# mock.log (every request's body), scarb.log (cairo: the fake scarb's calls); with acp:
# remote_before and remote_after (the remote's main before and after the run).
set -eu

cli=$1 preset=$2 work=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
rf=${RALPH_FLOW:-$root/target/debug/ralph-flow}
bin=${REALCLI_BIN:-$root/target/realcli/node_modules/.bin}
limit=${GOLDEN_TIMEOUT:-120}

repo=$work/repo
home=$work/home
mkdir -p "$repo" "$home/.codex" "$home/.gemini" "$work/bin"

variant=
[ "$cli" = acp ] && variant=acp

# The mock, on loopback.
SCRIPT_VARIANT=$variant SCRIPT_LOG=$work/script.log MOCK_LOG=$work/mock.log python3 "$root/tests/realcli/scripted_mock.py" 0 >"$work/port" 2>"$work/mock.err" &
mock=$!
run=
cleanup() {
    [ -n "$run" ] && kill -INT "$run" 2>/dev/null || true
    kill "$mock" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
i=0
while [ ! -s "$work/port" ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
port=$(cat "$work/port")
base=http://127.0.0.1:$port

cat >"$home/.codex/config.toml" <<EOF
model_provider = "mock"

[model_providers.mock]
name = "mock"
base_url = "$base/v1"
env_key = "MOCK_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

# Offline, codex would wait 5 s at exit trying to send its analytics.
[analytics]
enabled = false
EOF

# gemini: the API key auth (with the base URL alone it picks the `gateway` auth and exits 41),
# one attempt per request (it retries its own errors slowly; none are expected), no usage
# statistics or update checks sent out.
cat >"$home/.gemini/settings.json" <<EOF
{
  "security": {"auth": {"selectedType": "gemini-api-key"}},
  "general": {"maxAttempts": 1, "enableAutoUpdate": false, "enableAutoUpdateNotification": false},
  "privacy": {"usageStatisticsEnabled": false}
}
EOF

# A fake scarb for the Cairo preset's verify step: fmt passes, build needs a function in
# src/lib.cairo, test needs a #[test]; every call is logged.
cat >"$work/bin/scarb" <<EOF
#!/bin/sh
echo "scarb \$*" >>"$work/scarb.log"
case "\$1" in
fmt) exit 0 ;;
build) grep -q 'fn ' src/lib.cairo || { echo 'error: no function in src/lib.cairo' >&2; exit 1; } ;;
test) grep -q '#\[test\]' src/lib.cairo || { echo 'error: no tests found' >&2; exit 1; }
      echo 'test demo::tests::it_adds ... ok' ;;
esac
echo "   Finished \$1"
EOF
chmod +x "$work/bin/scarb"

# An `acp` agent's command is looked up on PATH (claude-agent-acp).
path_extra=
[ "$cli" = acp ] && path_extra=$bin:

# ralph-flow and the CLIs run with this environment only (as tests/realcli/capture.sh runs
# the CLIs): nothing of the caller's (an IS_SANDBOX, a real API key, a proxy) leaks in.
# `clean_env --exec CMD... &` makes $! the pid of CMD itself, so that it can be signalled.
clean_env() {
    _exec=
    if [ "$1" = --exec ]; then
        _exec=exec
        shift
    fi
    $_exec env -i PATH="$work/bin:$path_extra$PATH" HOME="$home" LANG=C.UTF-8 \
        CODEX_HOME="$home/.codex" MOCK_API_KEY=mock-key \
        ANTHROPIC_BASE_URL="$base" ANTHROPIC_API_KEY=sk-ant-mock-key \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
        GEMINI_API_KEY=mock-key GOOGLE_GEMINI_BASE_URL="$base" \
        RALPH_FLOW_CLAUDE="${RALPH_FLOW_CLAUDE:-$bin/claude}" \
        RALPH_FLOW_CODEX="${RALPH_FLOW_CODEX:-$bin/codex}" \
        RALPH_FLOW_GEMINI="${RALPH_FLOW_GEMINI:-$bin/gemini}" \
        "$@"
}

# A fresh repository with the preset's starting files and the workflow `init` writes.
cd "$repo"
git init -q -b main
git config user.name "Golden Path"
git config user.email golden@example.com
python3 "$root/tests/realcli/scripted_mock.py" --seed "$preset" "$repo"
# The ACP form of the preset: a preset of its own that extends it.
shipped=$preset
[ "$cli" = acp ] && shipped=$preset-acp
clean_env "$rf" init "$shipped" >"$work/init.out" 2>&1
flow=workflows/$shipped.toml
# The presets' agents are claude and codex: gemini replaces them with agents of the same
# names (as the init'd workflow says to), each keeping the preset's permissions. `--model`
# spares gemini its model router's side request (and a gemini-2 or -3 model keeps write_file
# from unescaping a `\n` in the content, as it does for the older gemini models).
gemini_agent() { # NAME [PERMISSIONS]
    printf '\n[agents.%s]\nkind = "gemini"\nmodel = "gemini-2.5-flash"\n' "$1" >>"$flow"
    [ -z "${2:-}" ] || printf 'permissions = "%s"\n' "$2" >>"$flow"
}
set --
case $preset in
wiggum-review)
    # The preset's reviewer is claude; codex and gemini replace it with an agent of the same
    # name.
    if [ "$cli" = codex ]; then
        printf '\n[agents.reviewer]\nkind = "codex"\npermissions = "full"\n' >>"$flow"
    elif [ "$cli" = gemini ]; then
        gemini_agent reviewer full
    fi
    # Its defaults: the built-in criteria, the paths src and scripts.
    ;;
cairo-driver-reviewer)
    set -- --set prompt=task.md --set rubric=rubric.md
    if [ "$cli" = gemini ]; then
        # The backends' default, codex, is gemini here (the params allow codex or claude).
        gemini_agent driver_codex
        gemini_agent reviewer_codex
    else
        set -- "$@" --set driver_backend="$cli" --set reviewer_backend="$cli"
    fi
    ;;
spider)
    set -- --set "test_command=python3 -m unittest discover -s tests -v"
    if [ "$cli" = acp ]; then
        # Both through claude-agent-acp (the builder's default, codex, is opencode).
        set -- "$@" --set author_backend=claude --set builder_backend=claude
    elif [ "$cli" = gemini ]; then
        # Both agents (the author's default claude, the builder's default codex) are gemini.
        gemini_agent claude full
        gemini_agent codex full
    else
        set -- "$@" --set author_backend="$cli" --set builder_backend="$cli"
    fi
    ;;
esac
git add -A
git commit -q -m "Start: $preset"
if [ "$cli" = acp ]; then
    # A remote the agent will ask to push to: the policy must deny it.
    git init -q --bare "$work/remote.git"
    git remote add origin "$work/remote.git"
    git push -q origin main
    git -C "$work/remote.git" rev-parse main >"$work/remote_before"
fi

# The run, in the background; gates are answered from here while it waits.
clean_env --exec "$rf" run "$flow" "$@" >"$work/run.out" 2>"$work/run.err" &
run=$!
: >"$work/gates"
start=$(date +%s)
while kill -0 "$run" 2>/dev/null; do
    if [ $(($(date +%s) - start)) -ge "$limit" ]; then
        echo "golden: the run took more than ${limit}s: stopped" >>"$work/run.err"
        # Ctrl-C: ralph-flow stops its agents and keeps the run (SIGTERM would kill it
        # outright and leave its agents running).
        kill -INT "$run" 2>/dev/null || true
        i=0
        while kill -0 "$run" 2>/dev/null && [ $i -lt 20 ]; do
            sleep 0.5
            i=$((i + 1))
        done
        kill -KILL "$run" 2>/dev/null || true
        break
    fi
    # Any gate the run waits on is approved, once, by another process (as a person would).
    if clean_env "$rf" status --json >"$work/status.now" 2>/dev/null; then
        python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
for g in s.get("pending_gates") or []:
    scope = g.get("scope") or ""
    print(s["id"], scope + "/" + g["gate"] if scope else g["gate"])
' "$work/status.now" >"$work/waiting" 2>/dev/null || : >"$work/waiting"
        while read -r id gate; do
            [ -n "$gate" ] || continue
            grep -qxF "$gate" "$work/gates" && continue
            clean_env USER=approver "$rf" approve "$id" "$gate" --comment "approved by the golden-path test" \
                >>"$work/approve.out" 2>&1 &&
                echo "$gate" >>"$work/gates"
        done <"$work/waiting"
    fi
    sleep 0.5
done
set +e
wait "$run"
code=$?
set -e
run=
echo "$code" >"$work/exit"
clean_env "$rf" status --json >"$work/status.json" 2>>"$work/run.err" || true
python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$work/status.json" >"$work/run_id" 2>/dev/null || true
if [ "$cli" = acp ]; then
    git -C "$work/remote.git" rev-parse main >"$work/remote_after" 2>>"$work/run.err" || true
fi
exit 0
