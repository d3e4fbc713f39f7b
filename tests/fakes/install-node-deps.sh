#!/bin/sh
# Installs what tests/fakes/schema-check/claude.cjs needs: the Ajv that claude-code 2.1.330
# bundles (8.18.0, with fast-uri 3.1.2; tests/fakes/README.md says how that was found), into
# DIR (default target/schema-check). Idempotent, and quick when already there. Needs node
# and npm (and the npm registry the first time).
#
# Usage: tests/fakes/install-node-deps.sh [DIR]
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/target/schema-check}

installed() {
    # installed PACKAGE VERSION
    v=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$dir/node_modules/$1/package.json" 2>/dev/null | head -1)
    [ "$v" = "$2" ]
}

if installed ajv 8.18.0 && installed fast-uri 3.1.2; then
    exit 0
fi
mkdir -p "$dir"
# Exact versions of Ajv and of each of its dependencies, so that npm resolves nothing.
cat >"$dir/package.json" <<'JSON'
{
  "name": "ralph-flow-schema-check",
  "private": true,
  "dependencies": {
    "ajv": "8.18.0",
    "fast-uri": "3.1.2",
    "fast-deep-equal": "3.1.3",
    "json-schema-traverse": "1.0.0",
    "require-from-string": "2.0.2"
  }
}
JSON
npm install --prefix "$dir" --no-audit --no-fund --no-package-lock --loglevel=error >&2
installed ajv 8.18.0 && installed fast-uri 3.1.2
echo "schema-check: Ajv 8.18.0 installed in $dir" >&2
