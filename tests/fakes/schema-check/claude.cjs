#!/usr/bin/env node
// Decides, as claude-code 2.1.330 does, whether `claude -p --json-schema S` accepts S, with
// the Ajv that claude bundles (tests/fakes/install-node-deps.sh installs it; see
// tests/fakes/README.md for how the version was found).
//
// Usage: node claude.cjs SCHEMA_TEXT   (the text given to --json-schema)
//   exit 0  accepted; Ajv's strict-mode warnings, if any, on stderr (claude prints them too)
//   exit 1  refused; stdout holds the line claude prints on stderr before exiting 1
//   exit 2  cannot decide (usage, or Ajv not installed)
//
// claude's code (the bundle, minified; names are ours):
//   parse:  JSON.parse(text), else "Error: --json-schema is not valid JSON: <error>"
//           (claude runs on Bun: JavaScriptCore words that error differently from node);
//           not a plain object: "Error: --json-schema must be a JSON object"
//   check:  more than 100,000 nodes or a depth over 10,000: "schema too large";
//           a truthy root $async: "$async schemas are not supported";
//           ajv = new Ajv({allErrors: true, validateFormats: false, multipleOfPrecision: 6});
//           !ajv.validateSchema(S): ajv.errorsText(ajv.errors); then ajv.compile(S); anything
//           thrown: its message
//   refusal: "Error: --json-schema is not a valid JSON Schema: <text>"
"use strict";

const path = require("path");

const NODES = 1e5;
const DEPTH = 1e4;
const deps = process.env.FAKE_NODE_DEPS || path.join(__dirname, "../../../target/schema-check");

function refuse(line) {
  process.stdout.write(line + "\n");
  process.exit(1);
}

// claude's size guard: counts every value (primitives too), the root at depth 0. Iterative,
// so that node's smaller stack does not decide; the outcome does not depend on the order.
function tooLarge(root) {
  const stack = [[root, 0]];
  let left = NODES;
  while (stack.length) {
    const [v, depth] = stack.pop();
    if (--left < 0 || depth > DEPTH) return true;
    if (typeof v === "object" && v !== null) {
      for (const child of Object.values(v)) stack.push([child, depth + 1]);
    }
  }
  return false;
}

function check(schema) {
  if (tooLarge(schema)) return "schema too large";
  if (Boolean(schema.$async)) return "$async schemas are not supported";
  let Ajv;
  try {
    Ajv = require(require.resolve("ajv", { paths: [deps] }));
  } catch (e) {
    process.stderr.write(
      `schema-check: Ajv is not installed in ${deps}: run tests/fakes/install-node-deps.sh\n`
    );
    process.exit(2);
  }
  try {
    const ajv = new Ajv({ allErrors: true, validateFormats: false, multipleOfPrecision: 6 });
    if (!ajv.validateSchema(schema)) return ajv.errorsText(ajv.errors);
    ajv.compile(schema);
    return null;
  } catch (e) {
    return e instanceof Error ? e.message : String(e);
  }
}

if (process.argv.length !== 3) {
  process.stderr.write("usage: node claude.cjs SCHEMA_TEXT\n");
  process.exit(2);
}
let schema;
try {
  schema = JSON.parse(process.argv[2]);
} catch (e) {
  refuse(`Error: --json-schema is not valid JSON: ${e.message}`);
}
if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
  refuse("Error: --json-schema must be a JSON object");
}
const why = check(schema);
if (why !== null) refuse(`Error: --json-schema is not a valid JSON Schema: ${why}`);
