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
