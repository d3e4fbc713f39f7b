#!/usr/bin/env python3
"""What OpenAI's strict structured outputs refuse in a JSON Schema, and how it says so.

`codex exec --output-schema FILE` sends FILE's schema as the Responses API's
`text.format = {type: "json_schema", name: "codex_output_schema", strict: true, schema}`;
a Chat Completions client sends `response_format = {type: "json_schema", json_schema:
{name, strict: true, schema}}`. The service refuses a schema outside its subset with HTTP 400.
`check(schema, name, api)` gives that answer, or None when the schema passes.

Each rule names its source. "seen": an error the live service gave, as reported in the
issue named (the message wording is copied from there). "docs": OpenAI's own structured
outputs guide (platform.openai.com/docs/guides/structured-outputs, "Supported schemas");
those refusals have no reported wording, so theirs is ours, built the same way.

The walk (so that the first violation found is deterministic): the root's own rule, then
depth-first from the root, each node before its children. At a node: a non-object schema,
then the `type` key, then each keyword in the node's own key order (is it permitted?),
then, for an object, `additionalProperties`, then `required`; then the subschemas, in the
node's key order (`properties` in their order, `items`, `anyOf` by index, `$defs` /
`definitions` in their order); a `$ref` is not followed. The limits are checked once the
walk found nothing. A context is the path from the root, as a Python tuple of strings.

Usage:
  openai_strict.py FILE [NAME]   exit 1 and the service's message on stdout when refused,
                                 exit 0 when accepted (NAME: codex_output_schema)
  openai_strict.py --self-test   checks each rule; exit 0 when all pass
"""

import json
import sys

# docs: the types; `null` as part of a type array or of an anyOf.
TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
# docs: keywords of any node (`$ref`, `$defs` / `definitions`: recursion allowed; `anyOf`
# not at the root).
GENERAL = {"type", "description", "title", "$schema", "$ref", "$defs", "definitions", "anyOf", "enum", "const"}
# docs: keywords by type. Anything else is "not permitted" (seen: 'default' livekit/agents#1987
# 2025-05, instructor#1074; 'propertyNames' can1357/oh-my-pi#209 2026-02; maxLength
# jina-ai/node-DeepResearch#79 2025-03; 'uniqueItems' through codex, 2026). Note:
# pydantic/pydantic-ai#4490 (2026-03, closed unmerged) claims minLength/maxLength pass since
# 2025-05; the guide does not list them, so they stay refused here.
BY_TYPE = {
    "string": {"pattern", "format"},
    "number": {"multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"},
    "integer": {"multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"},
    "array": {"items", "minItems", "maxItems"},
    "object": {"properties", "required", "additionalProperties"},
    "boolean": set(),
    "null": set(),
}
# docs: the string formats.
FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
# docs: the limits.
MAX_PROPERTIES = 5000
MAX_NESTING = 10
MAX_ENUM_VALUES = 1000


class Refused(Exception):
    pass


def refuse(context, text):
    raise Refused(f"In context={tuple(context)!r}, {text}")


def types_of(node):
    t = node.get("type")
    return t if isinstance(t, list) else [t]


def walk(node, context, tally, depth):
    if not isinstance(node, dict):
        # docs (a boolean schema is not in the subset); wording ours.
        refuse(context, f"schema must be a JSON Schema object, got {json.dumps(node)}.")
    if "type" not in node and "anyOf" not in node and "$ref" not in node:
        # seen: openclaw/clawpatch#60 (2026-05, codex: an `enum` without `type`); an untyped
        # `const` through codex 0.154 (2026-09).
        refuse(context, "schema must have a 'type' key.")
    types = types_of(node) if "type" in node else []
    for t in types:
        if t not in TYPES:
            # docs; wording ours.
            refuse(context, f"type {json.dumps(t)} is not supported.")
    allowed = GENERAL.union(*(BY_TYPE[t] for t in types))
    for key in node:
        if key not in allowed:
            refuse(context, f"'{key}' is not permitted.")
    fmt = node.get("format")
    if fmt is not None and fmt not in FORMATS:
        # docs; wording ours.
        refuse(context, f"format {json.dumps(fmt)} is not supported.")
    if "enum" in node:
        tally["enum"] += len(node["enum"]) if isinstance(node["enum"], list) else 1
    if "array" in types and "items" not in node:
        # seen: makenotion/notion-mcp-server#23 (2025-04, a strict function's parameters).
        refuse(context, "array schema missing items.")
    if "object" in types:
        depth += 1
        tally["depth"] = max(tally["depth"], depth)
        props = node.get("properties") or {}
        tally["properties"] += len(props)
        if node.get("additionalProperties") is not False:
            # seen: mavam/pi-web-providers#14 (2026-04, codex), the wording and the body.
            refuse(context, "'additionalProperties' is required to be supplied and to be false.")
        required = node.get("required")
        required = required if isinstance(required, list) else []
        base = "'required' is required to be supplied and to be an array including every key in properties."
        for key in props:
            if key not in required:
                # seen: vercel/ai#6484 (2025-05), mastra-ai/mastra#12284 (2026-01).
                refuse(context, f"{base} Missing '{key}'.")
        for key in required:
            if key not in props:
                # docs (every key of required is a property); wording ours.
                refuse(context, f"{base} Extra required key '{key}' supplied.")
    for key, sub in node.items():
        if key == "properties":
            for name, s in sub.items():
                walk(s, context + ["properties", name], tally, depth)
        elif key == "items":
            walk(sub, context + ["items"], tally, depth)
        elif key == "anyOf":
            for i, s in enumerate(sub):
                walk(s, context + ["anyOf", str(i)], tally, depth)
        elif key in ("$defs", "definitions"):
            for name, s in sub.items():
                walk(s, context + [key, name], tally, depth)


def violation(schema):
    """The service's message after "Invalid schema for response_format 'NAME': ", or None."""
    t = schema.get("type") if isinstance(schema, dict) else None
    if t != "object":
        # seen: clay-good/OpenLore#52 (2026-04, 'type: "array"'); "None" when there is no
        # type: our guess of the same code.
        shown = t if isinstance(t, str) else repr(t)
        return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{shown}\"'."
    tally = {"properties": 0, "enum": 0, "depth": 0}
    try:
        if "anyOf" in schema:
            # docs: anyOf not at the root; wording ours.
            refuse([], "'anyOf' is not permitted.")
        walk(schema, [], tally, 0)
    except Refused as e:
        return str(e)
    # docs: the limits; wording ours.
    if tally["properties"] > MAX_PROPERTIES:
        return f"The schema has {tally['properties']} object properties in total, more than {MAX_PROPERTIES}."
    if tally["depth"] > MAX_NESTING:
        return f"The schema nests objects {tally['depth']} levels deep, more than {MAX_NESTING}."
    if tally["enum"] > MAX_ENUM_VALUES:
        return f"The schema has {tally['enum']} enum values in total, more than {MAX_ENUM_VALUES}."
    return None


def check(schema, name="codex_output_schema", api="responses"):
    """None, or the service's (status, body) refusing `schema`. `api`: "responses" (the
    param `text.format.schema`, code `invalid_json_schema`: seen, mavam/pi-web-providers#14)
    or "chat" (param `response_format`, code null: seen, clay-good/OpenLore#52, 2026-04)."""
    why = violation(schema)
    if why is None:
        return None
    responses = api == "responses"
    return 400, {
        "error": {
            "message": f"Invalid schema for response_format '{name}': {why}",
            "type": "invalid_request_error",
            "param": "text.format.schema" if responses else "response_format",
            "code": "invalid_json_schema" if responses else None,
        }
    }


# ---- self-test ----------------------------------------------------------------------------


def obj(props, **extra):
    return dict({"type": "object", "properties": props, "required": list(props), "additionalProperties": False}, **extra)


def nest(levels):
    """An object holding an object ... `levels` objects deep."""
    return obj({}) if levels == 1 else obj({"x": nest(levels - 1)})


S = {"type": "string"}
CASES = [
    # (what, schema, the message after the prefix or None)
    ("plain object", obj({"a": S, "n": {"type": "integer"}}), None),
    ("every documented keyword", obj({
        "s": {"type": "string", "pattern": "^a", "format": "date-time", "description": "d", "title": "t"},
        "n": {"type": "number", "minimum": 0, "maximum": 9, "exclusiveMinimum": -1, "exclusiveMaximum": 10, "multipleOf": 0.5},
        "l": {"type": "array", "items": S, "minItems": 1, "maxItems": 3},
        "e": {"type": "string", "enum": ["x", "y"]},
        "c": {"type": "string", "const": "k"},
        "u": {"anyOf": [S, {"type": "null"}]},
        "t": {"type": ["string", "null"]},
        "r": {"$ref": "#/$defs/node"},
    }, **{"$schema": "http://json-schema.org/draft-07/schema#",
          "$defs": {"node": obj({"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}})}}), None),
    ("root array", {"type": "array", "items": S},
     "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"array\"'."),
    ("root without type", {"anyOf": [obj({})]},
     "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"None\"'."),
    ("root anyOf", dict(obj({}), anyOf=[obj({})]), "In context=(), 'anyOf' is not permitted."),
    ("root additionalProperties", {"type": "object", "properties": {"a": S}, "required": ["a"]},
     "In context=(), 'additionalProperties' is required to be supplied and to be false."),
    ("nested additionalProperties", obj({"orgs": {"type": "array", "items": {"type": "object", "properties": {}}}}),
     "In context=('properties', 'orgs', 'items'), 'additionalProperties' is required to be supplied and to be false."),
    ("free-form map", obj({"m": {"type": "object", "additionalProperties": S}}),
     "In context=('properties', 'm'), 'additionalProperties' is required to be supplied and to be false."),
    ("missing required", dict(obj({"a": S, "roles": S}), required=["a"]),
     "In context=(), 'required' is required to be supplied and to be an array including every key in "
     "properties. Missing 'roles'."),
    ("no required", {"type": "object", "properties": {"a": S}, "additionalProperties": False},
     "In context=(), 'required' is required to be supplied and to be an array including every key in "
     "properties. Missing 'a'."),
    ("extra required", dict(obj({"a": S}), required=["a", "b"]),
     "In context=(), 'required' is required to be supplied and to be an array including every key in "
     "properties. Extra required key 'b' supplied."),
    ("default", obj({"error": {"type": "string", "default": "x"}}),
     "In context=('properties', 'error'), 'default' is not permitted."),
    ("propertyNames", obj({"m": dict(obj({}), propertyNames=S)}),
     "In context=('properties', 'm'), 'propertyNames' is not permitted."),
    ("maxLength", obj({"s": {"type": "string", "maxLength": 3}}), "In context=('properties', 's'), 'maxLength' is not permitted."),
    ("minLength", obj({"s": {"type": "string", "minLength": 1}}), "In context=('properties', 's'), 'minLength' is not permitted."),
    ("oneOf", obj({"x": {"type": "string", "oneOf": [S]}}), "In context=('properties', 'x'), 'oneOf' is not permitted."),
    ("allOf", obj({"x": {"type": "string", "allOf": [S]}}), "In context=('properties', 'x'), 'allOf' is not permitted."),
    ("not", obj({"x": {"type": "string", "not": S}}), "In context=('properties', 'x'), 'not' is not permitted."),
    ("if", dict(obj({}), **{"if": obj({})}), "In context=(), 'if' is not permitted."),
    ("patternProperties", dict(obj({}), patternProperties={"^a": S}), "In context=(), 'patternProperties' is not permitted."),
    ("uniqueItems", obj({"l": {"type": "array", "items": S, "uniqueItems": True}}),
     "In context=('properties', 'l'), 'uniqueItems' is not permitted."),
    ("prefixItems", obj({"l": {"type": "array", "prefixItems": [S]}}), "In context=('properties', 'l'), 'prefixItems' is not permitted."),
    ("examples", obj({"s": {"type": "string", "examples": ["a"]}}), "In context=('properties', 's'), 'examples' is not permitted."),
    ("nullable", obj({"s": {"type": "string", "nullable": True}}), "In context=('properties', 's'), 'nullable' is not permitted."),
    ("keyword of another type", obj({"n": {"type": "integer", "pattern": "x"}}), "In context=('properties', 'n'), 'pattern' is not permitted."),
    ("enum without type", obj({"findings": {"type": "array", "items": obj({"category": {"enum": ["bug"]}})}}),
     "In context=('properties', 'findings', 'items', 'properties', 'category'), schema must have a 'type' key."),
    ("const without type", obj({"ok": {"const": True}}), "In context=('properties', 'ok'), schema must have a 'type' key."),
    ("description only", obj({"d": {"description": "x"}}), "In context=('properties', 'd'), schema must have a 'type' key."),
    ("boolean subschema", obj({"l": {"type": "array", "items": True}}),
     "In context=('properties', 'l', 'items'), schema must be a JSON Schema object, got true."),
    ("anyOf branch", obj({"u": {"anyOf": [S, {"description": "x"}]}}),
     "In context=('properties', 'u', 'anyOf', '1'), schema must have a 'type' key."),
    ("$defs walked", dict(obj({}), **{"$defs": {"D": {"type": "object", "properties": {}}}}),
     "In context=('$defs', 'D'), 'additionalProperties' is required to be supplied and to be false."),
    ("array without items", obj({"children": {"type": "array"}}), "In context=('properties', 'children'), array schema missing items."),
    ("format", obj({"u": {"type": "string", "format": "uri"}}), "In context=('properties', 'u'), format \"uri\" is not supported."),
    ("unknown type", obj({"x": {"type": "strin"}}), "In context=('properties', 'x'), type \"strin\" is not supported."),
    ("order: the node before its children", {"type": "object", "properties": {"a": {"type": "object"}}},
     "In context=(), 'additionalProperties' is required to be supplied and to be false."),
    ("order: properties in their order", obj({"b": {"description": "x"}, "a": {"type": "string", "default": ""}}),
     "In context=('properties', 'b'), schema must have a 'type' key."),
    ("5,000 properties", obj({f"p{i}": S for i in range(5001)}),
     "The schema has 5001 object properties in total, more than 5000."),
    ("10 levels", nest(10), None),
    ("11 levels", nest(11), "The schema nests objects 11 levels deep, more than 10."),
    ("1,000 enum values", obj({"a": {"type": "integer", "enum": list(range(600))}, "b": {"type": "integer", "enum": list(range(401))}}),
     "The schema has 1001 enum values in total, more than 1000."),
]


def self_test():
    failed = 0
    for what, schema, want in CASES:
        got = violation(schema)
        if got != want:
            failed += 1
            print(f"FAIL {what}:\n  want {want}\n  got  {got}")
    status, body = check({"type": "array"}, "codex_output_schema")
    want = {"error": {"message": "Invalid schema for response_format 'codex_output_schema': schema must be a JSON "
                      "Schema of 'type: \"object\"', got 'type: \"array\"'.", "type": "invalid_request_error",
                      "param": "text.format.schema", "code": "invalid_json_schema"}}
    if (status, body) != (400, want):
        failed += 1
        print(f"FAIL the Responses body: {body}")
    status, body = check({"type": "array"}, "out", api="chat")
    if body["error"]["param"] != "response_format" or body["error"]["code"] is not None:
        failed += 1
        print(f"FAIL the chat body: {body}")
    if check(CASES[0][1]) is not None:
        failed += 1
        print("FAIL an accepted schema gives None")
    print(f"openai_strict self-test: {len(CASES) + 3 - failed} passed, {failed} failed")
    return 1 if failed else 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    if len(argv) not in (1, 2) or argv[0].startswith("-"):
        print(__doc__.split("Usage:")[1].rstrip(), file=sys.stderr)
        return 2
    try:
        with open(argv[0], encoding="utf-8") as f:
            schema = json.load(f)
    except (OSError, ValueError) as e:
        print(f"openai_strict: {argv[0]}: {e}", file=sys.stderr)
        return 2
    answer = check(schema, argv[1] if len(argv) > 1 else "codex_output_schema")
    if answer is None:
        return 0
    print(answer[1]["error"]["message"])
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
