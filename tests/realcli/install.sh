#!/bin/sh
# Installs the real agent CLIs, at the versions the captures in tests/fakes/captures come
# from, into a directory (default target/realcli):
# DIR/node_modules/.bin/{claude,codex,gemini,qwen,opencode,claude-agent-acp}.
# Idempotent: does nothing when those versions are already there. Needs node and npm
# (claude-code declares node >= 22 but its npm package is a native binary that runs
# under node 20 too; gemini-cli needs node >= 20; qwen-code declares node >= 22 and runs
# headless under node 20 (what the captures come from); opencode-ai is a native binary;
# claude-agent-acp, claude's Agent Client Protocol adapter (the renamed
# @zed-industries/claude-code-acp, on the Claude Agent SDK), declares node >= 22 and answers
# ACP under node 20).
#
# Usage: tests/realcli/install.sh [DIR]
set -eu

CLAUDE_VERSION=2.1.330
CODEX_VERSION=0.169.0
GEMINI_VERSION=0.61.0
QWEN_VERSION=0.24.4
OPENCODE_VERSION=1.18.33
CLAUDE_ACP_VERSION=0.101.0

root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/target/realcli}
mkdir -p "$dir"

installed() {
    # installed PACKAGE VERSION
    v=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$dir/node_modules/$1/package.json" 2>/dev/null | head -1)
    [ "$v" = "$2" ]
}

if installed @anthropic-ai/claude-code "$CLAUDE_VERSION" &&
    installed @openai/codex "$CODEX_VERSION" &&
    installed @google/gemini-cli "$GEMINI_VERSION" &&
    installed @qwen-code/qwen-code "$QWEN_VERSION" &&
    installed opencode-ai "$OPENCODE_VERSION" &&
    installed @agentclientprotocol/claude-agent-acp "$CLAUDE_ACP_VERSION" &&
    [ -x "$dir/node_modules/.bin/claude" ] && [ -x "$dir/node_modules/.bin/codex" ] &&
    [ -x "$dir/node_modules/.bin/gemini" ] && [ -x "$dir/node_modules/.bin/qwen" ] &&
    [ -x "$dir/node_modules/.bin/opencode" ] && [ -x "$dir/node_modules/.bin/claude-agent-acp" ]; then
    echo "real CLIs already installed in $dir"
    exit 0
fi

# A package.json of its own, so npm does not climb to an enclosing project.
[ -f "$dir/package.json" ] || echo '{"name":"ralph-flow-realcli","private":true}' >"$dir/package.json"
npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_VERSION" \
    "@openai/codex@$CODEX_VERSION" \
    "@google/gemini-cli@$GEMINI_VERSION" \
    "@qwen-code/qwen-code@$QWEN_VERSION" \
    "opencode-ai@$OPENCODE_VERSION" \
    "@agentclientprotocol/claude-agent-acp@$CLAUDE_ACP_VERSION"
echo "real CLIs installed in $dir:"
for c in claude codex gemini qwen opencode; do
    echo "  $c: $(HOME=${TMPDIR:-/tmp} "$dir/node_modules/.bin/$c" --version 2>/dev/null | tail -1)"
done
echo "  claude-agent-acp: $(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$dir/node_modules/@agentclientprotocol/claude-agent-acp/package.json" | head -1)"
