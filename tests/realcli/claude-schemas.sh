#!/bin/sh
# Checks tests/fakes/schema-check/claude.cjs against the real claude: each schema below is
# given to `claude -p --output-format json --json-schema S` (pointed at mock_api.py) and to
# the checker; the decision, the refusal line and the warnings must be the same.
#
# Usage: tests/realcli/claude-schemas.sh [REALCLI_DIR]   (after install.sh and
# tests/fakes/install-node-deps.sh). Prints one line per schema; exits 1 on a difference.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$root/target/realcli}/node_modules/.bin
check=$root/tests/fakes/schema-check/claude.cjs
work=$(mktemp -d)
python3 "$root/tests/realcli/mock_api.py" 0 >"$work/port" 2>/dev/null &
mock=$!
trap 'kill $mock 2>/dev/null || true; rm -rf "$work"' EXIT INT TERM
while [ ! -s "$work/port" ]; do sleep 0.1; done
port=$(cat "$work/port")
differ=0

# compare NAME SCHEMA_TEXT
compare() {
    mkdir -p "$work/$1/home" "$work/$1/cwd"
    (cd "$work/$1/cwd" && echo hi | env -i PATH="$PATH" HOME="$work/$1/home" \
        ANTHROPIC_BASE_URL="http://127.0.0.1:$port" ANTHROPIC_API_KEY=sk-ant-mock-key \
        CLAUDE_CODE_MAX_RETRIES=0 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
        timeout 120 "$bin/claude" -p --output-format json --json-schema "$2" \
        >"$work/$1/real.out" 2>"$work/$1/real.err") && real=0 || real=$?
    node "$check" "$2" >"$work/$1/check.out" 2>"$work/$1/check.err" && mine=0 || mine=$?
    if [ "$mine" = 1 ]; then
        # Refused: claude exits 1 with nothing on stdout and the checker's line on stderr.
        if [ "$real" = 1 ] && [ ! -s "$work/$1/real.out" ] &&
            cmp -s "$work/$1/check.out" "$work/$1/real.err"; then
            echo "same   $1: refused: $(cat "$work/$1/check.out")"
            return
        fi
    elif [ "$mine" = 0 ]; then
        # Accepted: claude answers (the mock's reply), its stderr holds Ajv's warnings only.
        if [ "$real" = 0 ] && cmp -s "$work/$1/check.err" "$work/$1/real.err"; then
            echo "same   $1: accepted$(sed 's/^/; warns: /' "$work/$1/check.err" | tr '\n' ' ')"
            return
        fi
    fi
    differ=1
    echo "DIFFER $1: checker exit $mine: $(cat "$work/$1/check.out" "$work/$1/check.err")"
    echo "       claude exit $real: $(head -c 300 "$work/$1/real.err") $(head -c 200 "$work/$1/real.out")"
}

deep=$(python3 -c 'print("{\"a\":" * 10001 + "1" + "}" * 10001)')
compare draft2020 '{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}'
compare draft04 '{"$schema":"http://json-schema.org/draft-04/schema#","type":"object"}'
compare draft07 '{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"a":{"type":"string"}},"required":["a"]}'
compare unknown_foo '{"type":"object","foo":1}'
compare prefixItems '{"type":"array","prefixItems":[{"type":"string"}]}'
compare dependentRequired '{"type":"object","dependentRequired":{"a":["b"]}}'
compare unevaluatedProperties '{"type":"object","unevaluatedProperties":false}'
compare anchor '{"$anchor":"x","type":"object"}'
compare discriminator '{"type":"object","discriminator":{"propertyName":"k"},"oneOf":[{"properties":{"k":{"const":"a"}}}]}'
compare additionalItems '{"type":"array","items":{"type":"string"},"additionalItems":false}'
compare tuple '{"type":"array","items":[{"type":"string"}]}'
compare defs_ref '{"type":"object","$defs":{"s":{"type":"string"}},"properties":{"a":{"$ref":"#/$defs/s"}}}'
compare definitions_ref '{"type":"object","definitions":{"s":{"type":"string"}},"properties":{"a":{"$ref":"#/definitions/s"}}}'
compare missing_ref '{"type":"object","properties":{"a":{"$ref":"#/definitions/nope"}}}'
compare nullable '{"type":"object","properties":{"a":{"type":"string","nullable":true}}}'
compare nullable_no_type '{"type":"object","properties":{"a":{"nullable":true}}}'
compare const_if '{"type":"object","properties":{"a":{"const":1}},"if":{"required":["a"]},"then":{"required":["b"]},"else":{}}'
compare format_nonsense '{"type":"object","properties":{"a":{"type":"string","format":"nonsense"}}}'
compare minimum_untyped '{"type":"object","properties":{"n":{"minimum":1}}}'
compare bad_type '{"type":"strin"}'
compare bad_required '{"type":"object","required":"a"}'
compare negative_minLength '{"type":"object","properties":{"a":{"type":"string","minLength":-1}}}'
compare bool_exclusive '{"type":"number","exclusiveMinimum":true}'
compare async '{"$async":true,"type":"object"}'
compare deep "$deep"
compare not_object '[{"type":"object"}]'
compare root_array '{"type":"array","items":{"type":"string"}}'
compare type_array '{"type":"object","properties":{"a":{"type":["string","null"]}},"required":["a"],"additionalProperties":false}'
exit $differ
