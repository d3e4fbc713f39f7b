# Shared by the fake agent CLIs in this directory (sourced, not run). POSIX sh only.
#
# After `fake_init NAME "$@"`, these are set:
#   FAKE_N       the call number (from 1) when FAKE_STATE_DIR is set, else 1
#   FAKE_MODE    the mode of this call (from FAKE_SEQUENCE, FAKE_MODE, or `ok`)
#   FAKE_TEXT    the reply, JSON-escaped (without the surrounding quotes)
#   FAKE_PROMPT  the prompt read from stdin
# See README.md for the environment contract.

# Escapes stdin as the inside of a JSON string: backslash, quote, tab, carriage return,
# newline (a trailing newline included).
fake_json_escape() {
    tab=$(printf '\t')
    cr=$(printf '\r')
    # The `x` keeps trailing newlines through the line-based tools; it is removed last.
    { cat; printf 'x'; } |
        sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e "s/$tab/\\\\t/g" -e "s/$cr/\\\\r/g" |
        awk '{ if (NR > 1) printf "%s", "\\n"; printf "%s", $0 }' |
        sed -e 's/x$//'
}

# Takes a lock on the state directory (mkdir is atomic), so that concurrent calls count
# correctly.
fake_lock() {
    i=0
    while ! mkdir "$FAKE_STATE_DIR/.lock" 2>/dev/null; do
        i=$((i + 1))
        if [ "$i" -gt 500 ]; then
            break
        fi
        sleep 0.01
    done
}

fake_unlock() {
    rmdir "$FAKE_STATE_DIR/.lock" 2>/dev/null
}

fake_init() {
    fake_name=$1
    shift
    FAKE_N=1
    if [ -n "${FAKE_STATE_DIR:-}" ]; then
        mkdir -p "$FAKE_STATE_DIR"
        fake_lock
        count_file="$FAKE_STATE_DIR/$fake_name.count"
        if [ -f "$count_file" ]; then
            FAKE_N=$(($(cat "$count_file") + 1))
        fi
        echo "$FAKE_N" >"$count_file"
        fake_unlock
    fi

    FAKE_MODE=${FAKE_MODE:-ok}
    if [ -n "${FAKE_SEQUENCE:-}" ]; then
        # The N-th word (commas count as spaces); the last one repeats.
        i=0
        for m in $(echo "$FAKE_SEQUENCE" | tr ',' ' '); do
            i=$((i + 1))
            FAKE_MODE=$m
            if [ "$i" -ge "$FAKE_N" ]; then
                break
            fi
        done
    fi

    FAKE_PROMPT=$(cat)

    if [ -n "${FAKE_LOG:-}" ]; then
        {
            echo "=== $fake_name call $FAKE_N mode $FAKE_MODE"
            echo "cwd: $(pwd)"
            for a in "$@"; do
                echo "arg: $a"
            done
            echo "prompt:"
            printf '%s\n' "$FAKE_PROMPT"
            echo "=== end"
        } >>"$FAKE_LOG"
    fi

    if [ -n "${FAKE_STATE_DIR:-}" ] && [ -f "$FAKE_STATE_DIR/reply.$FAKE_N" ]; then
        FAKE_TEXT=$(fake_json_escape <"$FAKE_STATE_DIR/reply.$FAKE_N")
    elif [ -n "${FAKE_REPLY_FILE:-}" ]; then
        FAKE_TEXT=$(fake_json_escape <"$FAKE_REPLY_FILE")
    else
        FAKE_TEXT=$(printf '%s' "${FAKE_REPLY-ok}" | fake_json_escape)
    fi

    FAKE_IN=${FAKE_INPUT_TOKENS:-100}
    FAKE_OUT=${FAKE_OUTPUT_TOKENS:-20}
    FAKE_CACHED=${FAKE_CACHED_TOKENS:-10}
    FAKE_SESSION_ID=${FAKE_SESSION:-fake-$fake_name-session-$FAKE_N}

    if [ "$FAKE_MODE" = slow ]; then
        sleep "${FAKE_DELAY:-2}"
    fi
}

# Whether an argument list holds a word: `fake_has WORD "$@"`.
fake_has() {
    want=$1
    shift
    for a in "$@"; do
        if [ "$a" = "$want" ]; then
            return 0
        fi
    done
    return 1
}

# Hangs without a word (a timeout or an idle timeout ends it).
fake_hang() {
    sleep 1000
    exit 0
}

# ---- replaying the real CLIs' captured output (captures/, see tests/realcli) ---------------
#
# A capture is what the real CLI printed against tests/realcli/mock_api.py: the mock's
# reply text, usage numbers and the normalized session id are replaced with this call's.

FAKE_CAPTURES=${FAKE_CAPTURES:-$(dirname "$0")/captures}

# Replaces the mock's values in stdin with this call's (literally: any text is safe).
# Set before: fake_name, FAKE_TEXT, FAKE_IN, FAKE_OUT, FAKE_CACHED, FAKE_SESSION_ID and
# optionally fake_model (the --model argument), fake_structured (a JSON value),
# fake_swap_from and fake_swap_to (a text of the capture and what replaces it).
fake_subst() {
    structured_esc=
    if [ -n "${fake_structured:-}" ]; then
        structured_esc=$(printf '%s' "$fake_structured" | fake_json_escape)
    fi
    FS_CLI=$fake_name FS_TEXT=$FAKE_TEXT FS_IN=$FAKE_IN FS_OUT=$FAKE_OUT FS_CACHED=$FAKE_CACHED \
        FS_SESSION=$FAKE_SESSION_ID FS_MODEL=${fake_model:-} FS_CAPTURED_MODEL=${fake_captured_model:-} \
        FS_COST=${FAKE_COST:-0.0123} FS_STRUCT=${fake_structured:-} FS_STRUCT_ESC=$structured_esc \
        FS_CLOCK=${fake_clock:-} FS_SWAP_FROM=${fake_swap_from:-} FS_SWAP_TO=${fake_swap_to:-} \
        awk 'BEGIN { RS = "\001" }
function rep(s, from, to,    out, i) {
    if (from == "") return s
    out = ""
    while ((i = index(s, from)) > 0) {
        out = out substr(s, 1, i - 1) to
        s = substr(s, i + length(from))
    }
    return out s
}
{
    s = $0
    s = rep(s, ENVIRON["FS_SWAP_FROM"], ENVIRON["FS_SWAP_TO"])
    s = rep(s, "MOCK-REPLY-4F7: the mock model says hello.", ENVIRON["FS_TEXT"])
    s = rep(s, "00000000-0000-4000-8000-000000000000", ENVIRON["FS_SESSION"])
    if (ENVIRON["FS_STRUCT"] != "") {
        s = rep(s, "{\\\"verdict\\\":\\\"MOCK-REPLY-4F7\\\",\\\"count\\\":3}", ENVIRON["FS_STRUCT_ESC"])
        s = rep(s, "{\"verdict\":\"MOCK-REPLY-4F7\",\"count\":3}", ENVIRON["FS_STRUCT"])
    }
    if (ENVIRON["FS_MODEL"] != "" && ENVIRON["FS_CAPTURED_MODEL"] != "")
        s = rep(s, "\"" ENVIRON["FS_CAPTURED_MODEL"] "\"", "\"" ENVIRON["FS_MODEL"] "\"")
    if (ENVIRON["FS_CLOCK"] != "") s = rep(s, "12:47 PM", ENVIRON["FS_CLOCK"])
    in_ = ENVIRON["FS_IN"]; out_ = ENVIRON["FS_OUT"]; c = ENVIRON["FS_CACHED"]
    if (ENVIRON["FS_CLI"] == "gemini") {
        gsub(/"prompt": 4321/, "\"prompt\": " in_, s)
        gsub(/"input": 4223/, "\"input\": " (in_ - c), s)
        gsub(/"candidates": 765/, "\"candidates\": " out_, s)
        gsub(/"cached": 98/, "\"cached\": " c, s)
        gsub(/"total": 5086/, "\"total\": " (in_ + out_), s)
    } else if (ENVIRON["FS_CLI"] == "opencode") {
        # Per step: input without the cache reads, which are apart.
        gsub(/"input":4223/, "\"input\":" (in_ - c), s)
        gsub(/"output":765/, "\"output\":" out_, s)
        gsub(/"read":98/, "\"read\":" c, s)
        gsub(/"total":5086/, "\"total\":" (in_ + out_), s)
    } else {
        gsub(/"input_tokens":(4321|8642)/, "\"input_tokens\":" in_, s)
        gsub(/"output_tokens":(765|1530)/, "\"output_tokens\":" out_, s)
        gsub(/"cache_read_input_tokens":(98|196)/, "\"cache_read_input_tokens\":" c, s)
        gsub(/"cached_input_tokens":(98|196)/, "\"cached_input_tokens\":" c, s)
        gsub(/"inputTokens":(4321|8642)/, "\"inputTokens\":" in_, s)
        gsub(/"outputTokens":(765|1530)/, "\"outputTokens\":" out_, s)
        gsub(/"cacheReadInputTokens":(98|196)/, "\"cacheReadInputTokens\":" c, s)
        gsub(/"total_cost_usd":[0-9.]+/, "\"total_cost_usd\":" ENVIRON["FS_COST"], s)
        gsub(/"costUSD":[0-9.]+/, "\"costUSD\":" ENVIRON["FS_COST"], s)
    }
    printf "%s", s
}'
}

# Prints a capture's stdout and stderr with this call's values: `fake_print CASE`. When
# `fake_stderr_filter` is set, stderr goes through that command (a function) first.
fake_print() {
    f=$FAKE_CAPTURES/$fake_name/$1
    if [ ! -f "$f.stdout" ]; then
        echo "fake $fake_name: no capture $f.stdout" >&2
        exit 2
    fi
    fake_subst <"$f.stdout"
    if [ -n "${fake_stderr_filter:-}" ]; then
        fake_subst <"$f.stderr" | "$fake_stderr_filter" >&2
    else
        fake_subst <"$f.stderr" >&2
    fi
}

# Keeps, of a Rust program's log lines (`TIME  LEVEL target: message`, as tracing prints
# them), those that RUST_LOG enables, as tracing-subscriber's EnvFilter does: the directive
# whose target is the longest prefix of the line's target decides (`LEVEL` alone applies to
# every target, `TARGET` alone means `TARGET=trace`); a RUST_LOG that has none for a target
# (`ralph_flow=debug`, empty) shows nothing of it. Unset, `$1` is the filter (the program's
# default). Other lines pass. Only what the capture holds can be shown: a RUST_LOG that
# enables more than the capture's did shows no more.
fake_rust_log() {
    if [ -n "${RUST_LOG+set}" ]; then
        filter=$RUST_LOG
    else
        filter=$1
    fi
    FS_FILTER=$filter awk '
function rank(l) {
    l = tolower(l)
    if (l == "off") return 0
    if (l == "error") return 1
    if (l == "warn") return 2
    if (l == "info") return 3
    if (l == "debug") return 4
    if (l == "trace") return 5
    return -1
}
BEGIN {
    n = split(ENVIRON["FS_FILTER"], dirs, ",")
    for (i = 1; i <= n; i++) {
        d = dirs[i]
        gsub(/^[ \t]+|[ \t]+$/, "", d)
        if (d == "") continue
        eq = index(d, "=")
        if (eq > 0) {
            t[i] = substr(d, 1, eq - 1); r[i] = rank(substr(d, eq + 1))
        } else if (rank(d) >= 0) {
            t[i] = ""; r[i] = rank(d)
        } else {
            t[i] = d; r[i] = 5
        }
        used[i] = 1
    }
}
{
    if (!match($0, /^[0-9][0-9-]*T[0-9:.]+Z +(ERROR|WARN|INFO|DEBUG|TRACE) [^ :]+(::[^ :]+)*:/)) {
        print
        next
    }
    split(substr($0, 1, RLENGTH - 1), w, / +/)
    level = rank(w[2]); target = w[3]
    best = -1; allowed = 0
    for (i = 1; i <= n; i++) {
        if (!used[i] || r[i] < 0) continue
        if (substr(target, 1, length(t[i])) == t[i] && length(t[i]) >= best) {
            best = length(t[i]); allowed = r[i]
        }
    }
    if (level <= allowed) print
}'
}

# Writes, in the working directory, the files the real CLI wrote in a case (its `.files`:
# `./PATH: CONTENT` lines, the content's newlines as spaces): `fake_write_files CASE`.
fake_write_files() {
    files=$FAKE_CAPTURES/$fake_name/$1.files
    [ -f "$files" ] || return 0
    while IFS= read -r line; do
        path=${line%%: *}
        text=${line#*: }
        case $path in
        ./*/* | */../* | ../*) continue ;; # only files right in the working directory
        ./*) printf '%s\n' "${text% }" >"$path" ;;
        esac
    done <"$files"
}

# Makes the commits the real CLI made in a case run in a git repository (its `.repo`:
# `commits: NEWEST ... init`, the capture's own `init` last), as the mock's model made them
# (`git add -A && git commit -q -m MESSAGE`), when the working directory is in a git
# repository: `fake_commit CASE`. A commit git refuses (no identity, nothing to commit) is
# not made, as the real CLI's would not be.
fake_commit() {
    repo=$FAKE_CAPTURES/$fake_name/$1.repo
    [ -f "$repo" ] || return 0
    made=$(sed -n 's/^commits: //p' "$repo")
    [ -n "$made" ] || return 0
    git rev-parse --is-inside-work-tree >/dev/null 2>&1 || return 0
    # Oldest first, the capture's `init` left out.
    for m in $(printf '%s\n' $made | sed '$d' | sed -n '1!G;h;$p'); do
        { git add -A && git commit -q -m "$m"; } >/dev/null 2>&1 || return 0
    done
}

# Prints a capture, leaves what the real CLI left (the files it wrote, the commits it made)
# and exits with its exit code: `fake_replay CASE`.
fake_replay() {
    fake_print "$1"
    fake_write_files "$1"
    fake_commit "$1"
    exit "$(cat "$FAKE_CAPTURES/$fake_name/$1.exit")"
}

# The value after an option in the arguments: `fake_opt --model "$@"`.
fake_opt() {
    want=$1
    shift
    prev=
    for a in "$@"; do
        if [ "$prev" = "$want" ]; then
            printf '%s' "$a"
            return 0
        fi
        prev=$a
    done
    return 1
}

# ---- output schemas the real CLIs refuse (schema-check/, ../realcli/openai_strict.py) --------

# Says that a schema cannot be decided here, and exits 2: `fake_no_checker WHAT`.
fake_no_checker() {
    echo "fake $fake_name: cannot check the output schema as $fake_name does: $1" >&2
    exit 2
}

# claude's check of `--json-schema TEXT` (Ajv, as claude bundles it): on a refusal, replays
# what claude printed, with the checker's message. `fake_claude_schema TEXT`.
fake_claude_schema() {
    command -v node >/dev/null 2>&1 ||
        fake_no_checker "node is not on PATH (then run tests/fakes/install-node-deps.sh)"
    refusal=$(node "$(dirname "$0")/schema-check/claude.cjs" "$1")
    code=$?
    case $code in
    0) return 0 ;;
    1) ;;
    *) fake_no_checker "run tests/fakes/install-node-deps.sh" ;;
    esac
    if [ "$refusal" = "Error: --json-schema must be a JSON object" ]; then
        fake_replay schema_not_object
    fi
    fake_swap_from=$(cat "$FAKE_CAPTURES/$fake_name/schema_unknown_keyword.stderr")
    fake_swap_to=$refusal
    fake_replay schema_unknown_keyword
}

# OpenAI's strict-mode check of `--output-schema FILE`: on a refusal, replays what codex
# printed of the service's 400, with the checker's message. `fake_codex_schema FILE`.
fake_codex_schema() {
    command -v python3 >/dev/null 2>&1 || fake_no_checker "python3 is not on PATH"
    refusal=$(python3 "$(dirname "$0")/../realcli/openai_strict.py" "$1")
    code=$?
    case $code in
    0) return 0 ;;
    1) ;;
    *) fake_no_checker "tests/realcli/openai_strict.py could not read $1" ;;
    esac
    # The capture's message, inside the body inside codex's JSON event: escaped twice.
    fake_swap_from="Invalid schema for response_format 'codex_output_schema': In context=(), 'additionalProperties' is required to be supplied and to be false."
    fake_swap_to=$(printf '%s' "$refusal" | fake_json_escape | fake_json_escape)
    fake_replay schema_refused
}
