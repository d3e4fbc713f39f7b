//! Schema dialects: the subset of JSON Schema an agent backend accepts, and the lowering of a
//! stage's schema (the author's, draft 2020-12) to it.
//!
//! The author's schema stays the single source of truth: every answer is validated against
//! it in full. A lowering only changes what the backend is sent:
//!
//! - it drops what the backend does not know and what only narrows (annotations, length
//!   limits, `not`, `if`...): the answer is still validated against those afterwards;
//! - it rewrites what the backend needs written differently (draft 2020-12's `prefixItems`
//!   and `dependentRequired` for claude's draft-07 validator; an optional field as required
//!   and nullable, `oneOf` as `anyOf`, for OpenAI's strict mode). Where that changes the
//!   meaning, [`Lowered::restore`] maps the answer back before it is validated (a null that
//!   stands for an absent optional field is removed);
//! - it refuses what the backend cannot express ([`Refusal`]: the path in the author's schema,
//!   the rule, the fix). The checker reports refusals for the stages that use the agent, so a
//!   run never starts with a schema its agents would refuse.
//!
//! Where each rule comes from:
//!
//! - **claude** (`claude -p --json-schema`, claude-code 2.1.330): the CLI compiles the schema
//!   with a stock Ajv v8 (`new Ajv({allErrors: true, validateFormats: false,
//!   multipleOfPrecision: 6})`, read in its bundle): draft-07 only, in strict mode. The real
//!   CLI refuses a draft 2020-12 `$schema` ("no schema with key or ref ..."), any keyword Ajv's
//!   draft-07 vocabulary lacks ("strict mode: unknown keyword: \"prefixItems\""), and
//!   `additionalItems` beside a non-array `items`; it refuses a schema that is not a JSON
//!   object ("--json-schema must be a JSON object"). Seen against the real CLI, captured in
//!   `tests/fakes/captures/claude/`.
//! - **OpenAI strict structured outputs** (`codex exec --output-schema`, which sends
//!   `strict: true`; the `openai` kind against OpenAI itself): the service answers 400
//!   `invalid_json_schema` when an object lacks `additionalProperties: false`, when `required`
//!   does not list every property, when a keyword is outside its set ("'default' is not
//!   permitted", "'propertyNames' is not permitted", "maxLength is not permitted"), when a
//!   node has no type, and when the root is not an object (live reports of other agent tools,
//!   listed in `tests/fakes/README.md`). The supported keywords, the nine formats and the
//!   limits (10 levels of nesting, 5,000 properties, 1,000 enum values) are the service's
//!   documentation's.

use serde_json::{Map, Value, json};

/// A subset of JSON Schema that a backend accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// claude's `--json-schema`: Ajv v8, draft-07, strict mode.
    Claude,
    /// OpenAI's strict structured outputs (codex `--output-schema`, OpenAI's own API).
    OpenAiStrict,
}

impl Dialect {
    /// Who refuses, for messages (after the agent and its kind: claude and qwen share the
    /// first).
    pub fn who(self) -> &'static str {
        match self {
            Dialect::Claude => "--json-schema (draft-07, Ajv strict mode)",
            Dialect::OpenAiStrict => "OpenAI's strict structured outputs",
        }
    }
}

/// A part of a schema that a dialect cannot express.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Where, as a JSON pointer into the author's schema (`""` for the root).
    pub pointer: String,
    /// The rule, in a few words.
    pub rule: &'static str,
    /// What is wrong there.
    pub message: String,
    /// What to do.
    pub fix: String,
}

/// A schema lowered to a dialect, with what maps an answer back.
#[derive(Clone, Debug, PartialEq)]
pub struct Lowered {
    /// What the backend is sent.
    pub schema: Value,
    /// The author's schema, when the lowering changed what an answer means (optional fields
    /// made required and nullable): [`Lowered::restore`] walks it.
    author: Option<Value>,
}

impl Lowered {
    /// Maps an answer given under the lowered schema back to the author's: a `null` given
    /// for an optional field whose own schema does not take `null` is removed (the lowering
    /// made the field required and nullable). Other values are left as they are.
    pub fn restore(&self, answer: &mut Value) {
        if let Some(author) = &self.author {
            restore(author, author, answer, 0);
        }
    }

    /// Restores the answer in a text, when the text is a JSON document; the text otherwise.
    pub fn restore_text(&self, text: &str) -> Option<String> {
        self.author.as_ref()?;
        let mut value: Value = serde_json::from_str(text.trim()).ok()?;
        self.restore(&mut value);
        serde_json::to_string(&value).ok()
    }
}

/// The refusals in one text, for an error message: each with its place and its fix.
pub fn refusals_text(refusals: &[Refusal]) -> String {
    refusals
        .iter()
        .map(|r| {
            let at = if r.pointer.is_empty() {
                "the root"
            } else {
                &r.pointer
            };
            format!("{} (at `{at}` of the output schema); {}", r.message, r.fix)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lowers a schema to a dialect, or says every part of it that the dialect cannot express.
pub fn lower(schema: &Value, dialect: Dialect) -> Result<Lowered, Vec<Refusal>> {
    let mut refusals = Vec::new();
    let lowered = match dialect {
        Dialect::Claude => {
            if !schema.is_object() {
                refusals.push(Refusal {
                    pointer: String::new(),
                    rule: "an object schema",
                    message: "claude's --json-schema must be a JSON object".into(),
                    fix: "write the schema as an object (`{\"type\": ...}`)".into(),
                });
                schema.clone()
            } else {
                let mut w = Walk::new(dialect, &mut refusals);
                w.claude(schema, "")
            }
        }
        Dialect::OpenAiStrict => {
            let mut w = Walk::new(dialect, &mut refusals);
            let out = w.strict_root(schema);
            w.limits(&out);
            out
        }
    };
    if !refusals.is_empty() {
        return Err(refusals);
    }
    let author =
        (dialect == Dialect::OpenAiStrict && changes_meaning(schema)).then(|| schema.clone());
    Ok(Lowered {
        schema: lowered,
        author,
    })
}

/// Keywords whose value is a schema.
const SCHEMA_KEYWORDS: &[&str] = &[
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "not",
    "contentSchema",
];
/// Keywords whose value is an array of schemas.
const SCHEMA_ARRAY_KEYWORDS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems", "items"];
/// Keywords whose value is a map of schemas.
const SCHEMA_MAP_KEYWORDS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// The keywords Ajv v8 knows in its default (draft-07) vocabularies, which claude uses: any
/// other keyword is refused in strict mode.
const AJV_DRAFT7: &[&str] = &[
    "$id",
    "$schema",
    "$ref",
    "$comment",
    "$defs",
    "definitions",
    "type",
    "enum",
    "const",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "format",
    "items",
    "additionalItems",
    "maxItems",
    "minItems",
    "uniqueItems",
    "contains",
    "maxProperties",
    "minProperties",
    "required",
    "properties",
    "patternProperties",
    "additionalProperties",
    "dependencies",
    "propertyNames",
    "if",
    "then",
    "else",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "title",
    "description",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "examples",
    "contentMediaType",
    "contentEncoding",
    "nullable",
];

/// The keywords OpenAI's strict mode permits.
const STRICT_PERMITTED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "anyOf",
    "enum",
    "const",
    "$ref",
    "$defs",
    "definitions",
    "description",
    "title",
    "pattern",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];

/// The string formats OpenAI's strict mode accepts.
const STRICT_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

/// OpenAI's documented limits.
const STRICT_MAX_DEPTH: usize = 10;
const STRICT_MAX_PROPERTIES: usize = 5000;
const STRICT_MAX_ENUM_VALUES: usize = 1000;

/// Appends a token to a JSON pointer.
fn at(pointer: &str, token: &str) -> String {
    format!("{pointer}/{}", token.replace('~', "~0").replace('/', "~1"))
}

struct Walk<'r> {
    dialect: Dialect,
    refusals: &'r mut Vec<Refusal>,
}

impl<'r> Walk<'r> {
    fn new(dialect: Dialect, refusals: &'r mut Vec<Refusal>) -> Self {
        Walk { dialect, refusals }
    }

    fn refuse(&mut self, pointer: &str, rule: &'static str, message: String, fix: &str) {
        let fix = format!(
            "{fix}, or set `structured_output = \"prompt\"` on the agent to send the schema in \
             the prompt instead"
        );
        self.refusals.push(Refusal {
            pointer: pointer.to_string(),
            rule,
            message: format!("{}: {message}", self.dialect.who()),
            fix,
        });
    }

    // ---- claude ---------------------------------------------------------------------------

    /// Lowers a subschema for claude's Ajv (draft-07, strict).
    fn claude(&mut self, node: &Value, pointer: &str) -> Value {
        let Some(obj) = node.as_object() else {
            // Booleans are schemas in draft-07 too.
            return node.clone();
        };
        let mut out = Map::new();
        let mut dependencies = obj
            .get("dependencies")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (key, value) in obj {
            let here = at(pointer, key);
            match key.as_str() {
                // Ajv's default meta-schema is draft-07: any other `$schema` is refused, and
                // draft-07's own adds nothing.
                "$schema" => {}
                "$dynamicRef" | "$recursiveRef" => self.refuse(
                    &here,
                    "draft-07",
                    format!("`{key}` is a later draft's and cannot be lowered to draft-07"),
                    "refer by path (`\"$ref\": \"#/$defs/NAME\"`)",
                ),
                // Anchors: names a draft-07 validator does not resolve; `$ref` to one is
                // refused below.
                "$anchor" | "$dynamicAnchor" | "$recursiveAnchor" | "$vocabulary" => {}
                "$ref" => {
                    if value
                        .as_str()
                        .is_some_and(|r| r.starts_with('#') && !r.starts_with("#/") && r != "#")
                    {
                        self.refuse(
                            &here,
                            "draft-07",
                            format!("`$ref` to an anchor ({value}) cannot be resolved in draft-07"),
                            "refer by path (`\"$ref\": \"#/$defs/NAME\"`)",
                        );
                    }
                    out.insert(key.clone(), value.clone());
                }
                // Draft 2020-12's tuples are draft-07's array `items` and `additionalItems`.
                "prefixItems" => {
                    if let Some(items) = value.as_array() {
                        let lowered: Vec<Value> = items
                            .iter()
                            .enumerate()
                            .map(|(i, s)| self.claude(s, &at(&here, &i.to_string())))
                            .collect();
                        out.insert("items".into(), Value::Array(lowered));
                        if let Some(rest) = obj.get("items") {
                            out.insert(
                                "additionalItems".into(),
                                self.claude(rest, &at(pointer, "items")),
                            );
                        }
                    }
                }
                "items" if obj.contains_key("prefixItems") => {}
                "items" => {
                    let lowered = match value {
                        Value::Array(items) => Value::Array(
                            items
                                .iter()
                                .enumerate()
                                .map(|(i, s)| self.claude(s, &at(&here, &i.to_string())))
                                .collect(),
                        ),
                        other => self.claude(other, &here),
                    };
                    out.insert(key.clone(), lowered);
                }
                // Ajv refuses `additionalItems` unless `items` is an array (it means nothing
                // then).
                "additionalItems" if obj.get("items").is_some_and(Value::is_array) => {
                    out.insert(key.clone(), self.claude(value, &here));
                }
                "additionalItems" => {}
                "dependentRequired" => {
                    if let Some(map) = value.as_object() {
                        for (k, v) in map {
                            dependencies.insert(k.clone(), v.clone());
                        }
                    }
                }
                "dependentSchemas" => {
                    if let Some(map) = value.as_object() {
                        for (k, v) in map {
                            let lowered = self.claude(v, &at(&here, k));
                            dependencies.insert(k.clone(), lowered);
                        }
                    }
                }
                "dependencies" => {
                    if let Some(map) = value.as_object() {
                        for (k, v) in map {
                            if v.is_object() || v.is_boolean() {
                                let lowered = self.claude(v, &at(&here, k));
                                dependencies.insert(k.clone(), lowered);
                            }
                        }
                    }
                }
                k if SCHEMA_MAP_KEYWORDS.contains(&k) => {
                    let lowered = match value.as_object() {
                        Some(map) => Value::Object(
                            map.iter()
                                .map(|(name, s)| (name.clone(), self.claude(s, &at(&here, name))))
                                .collect(),
                        ),
                        None => value.clone(),
                    };
                    out.insert(key.clone(), lowered);
                }
                k if SCHEMA_ARRAY_KEYWORDS.contains(&k) => {
                    let lowered = match value.as_array() {
                        Some(items) => Value::Array(
                            items
                                .iter()
                                .enumerate()
                                .map(|(i, s)| self.claude(s, &at(&here, &i.to_string())))
                                .collect(),
                        ),
                        None => value.clone(),
                    };
                    out.insert(key.clone(), lowered);
                }
                k if SCHEMA_KEYWORDS.contains(&k) && AJV_DRAFT7.contains(&k) => {
                    out.insert(key.clone(), self.claude(value, &here));
                }
                k if AJV_DRAFT7.contains(&k) => {
                    out.insert(key.clone(), value.clone());
                }
                // Anything else (2019-09 and 2020-12 keywords that only narrow, such as
                // `unevaluatedProperties` and `minContains`, and unknown annotations) would be
                // refused in strict mode; the answer is validated against it afterwards.
                _ => {}
            }
        }
        if !dependencies.is_empty() {
            out.insert("dependencies".into(), Value::Object(dependencies));
        }
        Value::Object(out)
    }

    // ---- OpenAI strict ------------------------------------------------------------------

    fn strict_root(&mut self, schema: &Value) -> Value {
        let out = self.strict(schema, "", 0);
        let is_object = out.get("type").is_some_and(|t| t == "object");
        if !is_object || out.get("anyOf").is_some() {
            self.refuse(
                "",
                "an object at the root",
                "the schema's root must be an object (`\"type\": \"object\"`), not a union or \
                 another type"
                    .into(),
                "wrap the answer in an object with one property",
            );
        }
        out
    }

    /// Lowers a subschema for OpenAI's strict mode.
    fn strict(&mut self, node: &Value, pointer: &str, depth: usize) -> Value {
        let Some(obj) = node.as_object() else {
            self.refuse(
                pointer,
                "no boolean schemas",
                format!("a boolean schema (`{node}`) cannot be expressed"),
                "write a schema with a type",
            );
            return node.clone();
        };
        // One `allOf` member and nothing else that constrains: that member.
        if let Some(all) = obj.get("allOf") {
            // Nothing else beside it that strict mode keeps, but its annotations.
            let alone = obj.keys().all(|k| {
                matches!(k.as_str(), "description" | "title")
                    || !STRICT_PERMITTED.contains(&k.as_str())
            });
            match all.as_array() {
                Some(members) if members.len() == 1 && alone => {
                    let mut inner =
                        self.strict(&members[0], &at(&at(pointer, "allOf"), "0"), depth);
                    if let (Some(o), Some(d)) = (inner.as_object_mut(), obj.get("description")) {
                        if !o.contains_key("$ref") {
                            o.entry("description").or_insert_with(|| d.clone());
                        }
                    }
                    return inner;
                }
                _ => {
                    self.refuse(
                        &at(pointer, "allOf"),
                        "no allOf",
                        "`allOf` cannot be expressed".into(),
                        "merge its members into one schema",
                    );
                    return node.clone();
                }
            }
        }
        if let Some(r) = obj.get("$ref") {
            let structural = obj.keys().any(|k| {
                k != "$ref"
                    && k != "$defs"
                    && k != "definitions"
                    && k != "description"
                    && k != "title"
                    && STRICT_PERMITTED.contains(&k.as_str())
            });
            if structural {
                self.refuse(
                    pointer,
                    "a $ref alone",
                    "a `$ref` with other keywords beside it cannot be expressed".into(),
                    "move the other keywords into the referenced schema",
                );
            }
            let mut out = Map::new();
            out.insert("$ref".into(), r.clone());
            self.strict_defs(obj, pointer, depth, &mut out);
            return Value::Object(out);
        }
        let mut out = Map::new();
        for key in ["title", "description"] {
            if let Some(v) = obj.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
        self.strict_defs(obj, pointer, depth, &mut out);
        // Unions: `oneOf` is sent as `anyOf` (the answer is still checked against `oneOf`).
        let union = match (obj.get("anyOf"), obj.get("oneOf")) {
            (Some(_), Some(_)) => {
                self.refuse(
                    pointer,
                    "one union",
                    "`anyOf` and `oneOf` together cannot be expressed".into(),
                    "keep one of them",
                );
                None
            }
            (Some(u), None) => Some(("anyOf", u)),
            (None, Some(u)) => Some(("oneOf", u)),
            (None, None) => None,
        };
        if let Some((key, branches)) = union {
            let here = at(pointer, key);
            let lowered: Vec<Value> = branches
                .as_array()
                .map(|b| {
                    b.iter()
                        .enumerate()
                        .map(|(i, s)| self.strict(s, &at(&here, &i.to_string()), depth))
                        .collect()
                })
                .unwrap_or_default();
            out.insert("anyOf".into(), Value::Array(lowered));
        }
        // The type: written, else what the enum or const holds, else what the keywords say.
        let types = types_of(obj);
        if types.is_empty() && union.is_none() {
            self.refuse(
                pointer,
                "a type on every node",
                "a value of any type (a schema without `type`) cannot be expressed".into(),
                "give it a `type`",
            );
            return Value::Object(out);
        }
        if !types.is_empty() {
            out.insert(
                "type".into(),
                if types.len() == 1 {
                    Value::String(types[0].clone())
                } else {
                    Value::Array(types.iter().cloned().map(Value::String).collect())
                },
            );
        }
        for key in ["enum", "const"] {
            if let Some(v) = obj.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
        if types.iter().any(|t| t == "string") {
            if let Some(p) = obj.get("pattern") {
                out.insert("pattern".into(), p.clone());
            }
            if let Some(f) = obj
                .get("format")
                .filter(|f| f.as_str().is_some_and(|f| STRICT_FORMATS.contains(&f)))
            {
                out.insert("format".into(), f.clone());
            }
        }
        if types.iter().any(|t| t == "number" || t == "integer") {
            for key in [
                "multipleOf",
                "maximum",
                "exclusiveMaximum",
                "minimum",
                "exclusiveMinimum",
            ] {
                if let Some(v) = obj.get(key) {
                    out.insert(key.into(), v.clone());
                }
            }
        }
        if types.iter().any(|t| t == "object") {
            self.strict_object(obj, pointer, depth, &mut out);
        }
        if types.iter().any(|t| t == "array") {
            self.strict_array(obj, pointer, depth, &mut out);
        }
        Value::Object(out)
    }

    fn strict_defs(
        &mut self,
        obj: &Map<String, Value>,
        pointer: &str,
        depth: usize,
        out: &mut Map<String, Value>,
    ) {
        for key in ["$defs", "definitions"] {
            if let Some(defs) = obj.get(key).and_then(Value::as_object) {
                let here = at(pointer, key);
                let lowered: Map<String, Value> = defs
                    .iter()
                    .map(|(name, s)| (name.clone(), self.strict(s, &at(&here, name), depth)))
                    .collect();
                out.insert(key.into(), Value::Object(lowered));
            }
        }
    }

    fn strict_object(
        &mut self,
        obj: &Map<String, Value>,
        pointer: &str,
        depth: usize,
        out: &mut Map<String, Value>,
    ) {
        if obj.contains_key("patternProperties") {
            self.refuse(
                &at(pointer, "patternProperties"),
                "no maps",
                "`patternProperties` (a map) cannot be expressed".into(),
                "list the object's properties",
            );
        }
        let extra = obj
            .get("additionalProperties")
            .or_else(|| obj.get("unevaluatedProperties"));
        let props = obj.get("properties").and_then(Value::as_object);
        match extra {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => self.refuse(
                &at(pointer, "additionalProperties"),
                "additionalProperties false",
                "an object that allows other keys (`additionalProperties: true`) cannot be \
                 expressed: every object must set `additionalProperties` to false"
                    .into(),
                "set `additionalProperties` to false (or remove it)",
            ),
            Some(_) => self.refuse(
                &at(pointer, "additionalProperties"),
                "no maps",
                "a typed map (`additionalProperties` with a schema) cannot be expressed".into(),
                "list the object's properties, or make it an array of {key, value} objects",
            ),
        }
        if props.is_none_or(Map::is_empty) && extra.is_none() {
            self.refuse(
                pointer,
                "no maps",
                "a free-form object (no `properties`) cannot be expressed: it could only be `{}`"
                    .into(),
                "list the object's properties, or set `additionalProperties` to false if it is \
                 always empty",
            );
        }
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut lowered = Map::new();
        let mut all = Vec::new();
        if let Some(props) = props {
            let here = at(pointer, "properties");
            for (name, s) in props {
                let mut p = self.strict(s, &at(&here, name), depth + 1);
                if !required.contains(&name.as_str()) {
                    p = nullable(p);
                }
                lowered.insert(name.clone(), p);
                all.push(Value::String(name.clone()));
            }
        }
        out.insert("properties".into(), Value::Object(lowered));
        out.insert("required".into(), Value::Array(all));
        out.insert("additionalProperties".into(), Value::Bool(false));
    }

    fn strict_array(
        &mut self,
        obj: &Map<String, Value>,
        pointer: &str,
        depth: usize,
        out: &mut Map<String, Value>,
    ) {
        if obj.contains_key("prefixItems") || obj.get("items").is_some_and(Value::is_array) {
            self.refuse(
                pointer,
                "no tuples",
                "a tuple (`prefixItems`) cannot be expressed".into(),
                "use an object with named properties",
            );
            return;
        }
        match obj.get("items") {
            Some(items) => {
                let lowered = self.strict(items, &at(pointer, "items"), depth + 1);
                out.insert("items".into(), lowered);
            }
            None => self.refuse(
                pointer,
                "a type on every node",
                "an array of values of any type (no `items`) cannot be expressed".into(),
                "give the array its `items`",
            ),
        }
        for key in ["minItems", "maxItems"] {
            if let Some(v) = obj.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
    }

    /// The documented limits, over the lowered schema.
    fn limits(&mut self, lowered: &Value) {
        let mut count = Counts::default();
        count.walk(lowered, 1);
        if count.depth > STRICT_MAX_DEPTH {
            self.refuse(
                "",
                "at most 10 levels of nesting",
                format!(
                    "the schema nests {} levels deep (at most {STRICT_MAX_DEPTH})",
                    count.depth
                ),
                "flatten the schema",
            );
        }
        if count.properties > STRICT_MAX_PROPERTIES {
            self.refuse(
                "",
                "at most 5,000 properties",
                format!(
                    "the schema has {} properties (at most {STRICT_MAX_PROPERTIES})",
                    count.properties
                ),
                "split the output",
            );
        }
        if count.enum_values > STRICT_MAX_ENUM_VALUES {
            self.refuse(
                "",
                "at most 1,000 enum values",
                format!(
                    "the schema's enums hold {} values (at most {STRICT_MAX_ENUM_VALUES})",
                    count.enum_values
                ),
                "use fewer enum values",
            );
        }
    }
}

#[derive(Default)]
struct Counts {
    depth: usize,
    properties: usize,
    enum_values: usize,
}

impl Counts {
    /// `level`: the nesting of objects and arrays, from 1 at the root.
    fn walk(&mut self, node: &Value, level: usize) {
        let Some(obj) = node.as_object() else {
            return;
        };
        let nests = obj
            .get("type")
            .is_some_and(|t| has_type(t, "object") || has_type(t, "array"));
        if nests {
            self.depth = self.depth.max(level);
        }
        let next = if nests { level + 1 } else { level };
        if let Some(e) = obj.get("enum").and_then(Value::as_array) {
            self.enum_values += e.len();
        }
        if let Some(p) = obj.get("properties").and_then(Value::as_object) {
            self.properties += p.len();
            for s in p.values() {
                self.walk(s, next);
            }
        }
        if let Some(items) = obj.get("items") {
            self.walk(items, next);
        }
        for s in obj
            .get("anyOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.walk(s, level);
        }
        for key in ["$defs", "definitions"] {
            for s in obj
                .get(key)
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(Map::values)
            {
                self.walk(s, level);
            }
        }
    }
}

fn has_type(t: &Value, name: &str) -> bool {
    match t {
        Value::String(s) => s == name,
        Value::Array(a) => a.iter().any(|v| v == name),
        _ => false,
    }
}

/// The JSON type of a value, as a schema names it.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The types a schema node says its values have: its `type`, else its enum's or const's
/// values' types, else the type its keywords imply (`properties`: object, `items`: array).
fn types_of(obj: &Map<String, Value>) -> Vec<String> {
    let mut types: Vec<String> = match obj.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect(),
        _ => Vec::new(),
    };
    if types.is_empty() {
        let values: Vec<&Value> = match (obj.get("enum"), obj.get("const")) {
            (Some(Value::Array(e)), _) => e.iter().collect(),
            (_, Some(c)) => vec![c],
            _ => Vec::new(),
        };
        for v in values {
            let t = json_type(v).to_string();
            if !types.contains(&t) {
                types.push(t);
            }
        }
        if types.iter().any(|t| t == "number") {
            types.retain(|t| t != "integer");
        }
    }
    if types.is_empty() {
        if obj.contains_key("properties") || obj.contains_key("additionalProperties") {
            types.push("object".into());
        } else if obj.contains_key("items") || obj.contains_key("prefixItems") {
            types.push("array".into());
        }
    }
    types
}

/// A lowered schema that also takes `null`.
fn nullable(mut s: Value) -> Value {
    let Some(obj) = s.as_object_mut() else {
        return s;
    };
    if obj.contains_key("$ref") {
        return json!({"anyOf": [s, {"type": "null"}]});
    }
    if let Some(Value::Array(branches)) = obj.get_mut("anyOf") {
        if !branches
            .iter()
            .any(|b| b.get("type").is_some_and(|t| has_type(t, "null")))
        {
            branches.push(json!({"type": "null"}));
        }
        return s;
    }
    match obj.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = std::mem::take(t);
            obj.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(a)) if !a.iter().any(|v| v == "null") => a.push("null".into()),
        _ => {}
    }
    if let Some(c) = obj.remove("const") {
        obj.insert("enum".into(), json!([c, null]));
    }
    if let Some(Value::Array(e)) = obj.get_mut("enum") {
        if !e.contains(&Value::Null) {
            e.push(Value::Null);
        }
    }
    s
}

/// Whether lowering to OpenAI's strict mode changes what an answer means: some object has a
/// property that is not required (it becomes required and nullable).
fn changes_meaning(schema: &Value) -> bool {
    let Some(obj) = schema.as_object() else {
        return false;
    };
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if props.keys().any(|k| !required.contains(&k.as_str())) {
            return true;
        }
    }
    obj.iter().any(|(k, v)| match k.as_str() {
        k if SCHEMA_MAP_KEYWORDS.contains(&k) => v
            .as_object()
            .is_some_and(|m| m.values().any(changes_meaning)),
        k if SCHEMA_ARRAY_KEYWORDS.contains(&k) || SCHEMA_KEYWORDS.contains(&k) => match v {
            Value::Array(a) => a.iter().any(changes_meaning),
            other => changes_meaning(other),
        },
        _ => false,
    })
}

/// Whether a schema (of the author's) takes `null`.
fn takes_null(root: &Value, s: &Value, depth: usize) -> bool {
    let Some(obj) = s.as_object() else {
        return s == &Value::Bool(true);
    };
    if depth > 64 {
        return false;
    }
    if let Some(t) = obj.get("type") {
        if !has_type(t, "null") {
            return false;
        }
    }
    if let Some(Value::Array(e)) = obj.get("enum") {
        if !e.contains(&Value::Null) {
            return false;
        }
    }
    if let Some(c) = obj.get("const") {
        if !c.is_null() {
            return false;
        }
    }
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        if let Some(target) = resolve(root, r) {
            if !takes_null(root, target, depth + 1) {
                return false;
            }
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(b)) = obj.get(key) {
            if !b.iter().any(|s| takes_null(root, s, depth + 1)) {
                return false;
            }
        }
    }
    if let Some(Value::Array(b)) = obj.get("allOf") {
        if !b.iter().all(|s| takes_null(root, s, depth + 1)) {
            return false;
        }
    }
    true
}

/// The schema a local `$ref` (`#/...`) points at.
fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let pointer = r.strip_prefix('#')?;
    root.pointer(pointer)
}

/// Removes, along the author's schema, the nulls given for optional fields that do not take
/// null.
fn restore(root: &Value, schema: &Value, answer: &mut Value, depth: usize) {
    if depth > 64 {
        return;
    }
    let Some(obj) = schema.as_object() else {
        return;
    };
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        if let Some(target) = resolve(root, r) {
            restore(root, target, answer, depth + 1);
        }
    }
    if let Some(Value::Array(members)) = obj.get("allOf") {
        for m in members {
            restore(root, m, answer, depth + 1);
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = obj.get(key) {
            // The first branch whose properties hold every key of the answer.
            let fits = |b: &&Value| match (
                answer.as_object(),
                b.get("properties").and_then(Value::as_object),
            ) {
                (Some(a), Some(p)) => a.keys().all(|k| p.contains_key(k)),
                _ => false,
            };
            if let Some(b) = branches.iter().find(fits) {
                restore(root, b, answer, depth + 1);
            }
        }
    }
    match answer {
        Value::Object(fields) => {
            let Some(props) = obj.get("properties").and_then(Value::as_object) else {
                return;
            };
            let required: Vec<&str> = obj
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            fields.retain(|k, v| {
                !(v.is_null()
                    && !required.contains(&k.as_str())
                    && props
                        .get(k)
                        .is_some_and(|s| !takes_null(root, s, depth + 1)))
            });
            for (k, v) in fields.iter_mut() {
                if let Some(s) = props.get(k) {
                    restore(root, s, v, depth + 1);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = obj.get("items") {
                for v in items {
                    restore(root, s, v, depth + 1);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict(s: Value) -> Value {
        lower(&s, Dialect::OpenAiStrict).expect("lowered").schema
    }

    fn strict_refused(s: Value) -> Vec<(String, &'static str)> {
        lower(&s, Dialect::OpenAiStrict)
            .expect_err("refused")
            .into_iter()
            .map(|r| (r.pointer, r.rule))
            .collect()
    }

    fn claude(s: Value) -> Value {
        lower(&s, Dialect::Claude).expect("lowered").schema
    }

    #[test]
    fn claude_drops_the_2020_12_declaration_and_keeps_the_rest() {
        let s = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "T",
            "type": "object",
            "required": ["a"],
            "properties": {"a": {"type": "string", "minLength": 1, "format": "date"}},
        });
        let l = claude(s.clone());
        let mut expected = s;
        expected.as_object_mut().map(|o| o.remove("$schema"));
        assert_eq!(l, expected);
        // Nothing to map back.
        let lowered = lower(&expected, Dialect::Claude).expect("lowered");
        assert_eq!(lowered.restore_text("{\"a\":null}"), None);
    }

    #[test]
    fn claude_gets_draft_7_tuples_and_dependencies() {
        let l = claude(json!({
            "type": "object",
            "properties": {
                "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false},
                "list": {"type": "array", "items": {"type": "string"}, "additionalItems": false, "minContains": 1, "contains": {"type": "string"}},
            },
            "dependentRequired": {"a": ["b"]},
            "dependentSchemas": {"c": {"required": ["d"], "unevaluatedProperties": false}},
            "unevaluatedProperties": false,
            "x-vendor": 1,
        }));
        assert_eq!(
            l,
            json!({
                "type": "object",
                "properties": {
                    "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": false},
                    "list": {"type": "array", "items": {"type": "string"}, "contains": {"type": "string"}},
                },
                "dependencies": {"a": ["b"], "c": {"required": ["d"]}},
            })
        );
    }

    #[test]
    fn claude_refuses_dynamic_references_and_anchor_refs() {
        let r = lower(&json!({"$dynamicRef": "#node"}), Dialect::Claude).expect_err("refused");
        assert_eq!(r[0].pointer, "/$dynamicRef");
        let r = lower(
            &json!({"properties": {"a": {"$ref": "#thing"}}, "$defs": {"t": {"$anchor": "thing"}}}),
            Dialect::Claude,
        )
        .expect_err("refused");
        assert_eq!(r[0].pointer, "/properties/a/$ref");
        assert!(
            r[0].fix.contains("structured_output = \"prompt\""),
            "{}",
            r[0].fix
        );
        let r = lower(&json!(true), Dialect::Claude).expect_err("refused");
        assert!(r[0].message.contains("must be a JSON object"));
        // Data is not walked: a const that looks like a schema stays.
        let l = claude(json!({"const": {"prefixItems": 1, "$schema": "x"}}));
        assert_eq!(l, json!({"const": {"prefixItems": 1, "$schema": "x"}}));
    }

    #[test]
    fn strict_requires_every_field_and_makes_optional_ones_nullable() {
        let l = strict(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Review",
            "type": "object",
            "required": ["verdict"],
            "properties": {
                "verdict": {"type": "string", "enum": ["VALID", "INVALID"]},
                "notes": {"type": "string", "minLength": 1, "default": ""},
                "score": {"type": "integer", "minimum": 0, "maximum": 100},
                "kind": {"enum": ["a", "b"]},
                "fixed": {"const": "x"},
                "issues": {"type": "array", "items": {"type": "object", "properties": {"d": {"type": "string"}}}},
            },
        }));
        assert_eq!(
            l,
            json!({
                "title": "Review",
                "type": "object",
                "properties": {
                    "verdict": {"type": "string", "enum": ["VALID", "INVALID"]},
                    "notes": {"type": ["string", "null"]},
                    "score": {"type": ["integer", "null"], "minimum": 0, "maximum": 100},
                    "kind": {"type": ["string", "null"], "enum": ["a", "b", null]},
                    "fixed": {"type": ["string", "null"], "enum": ["x", null]},
                    "issues": {
                        "type": ["array", "null"],
                        "items": {
                            "type": "object",
                            "properties": {"d": {"type": ["string", "null"]}},
                            "required": ["d"],
                            "additionalProperties": false,
                        },
                    },
                },
                "required": ["verdict", "notes", "score", "kind", "fixed", "issues"],
                "additionalProperties": false,
            })
        );
    }

    #[test]
    fn strict_answers_map_back_to_the_authors_schema() {
        let author = json!({
            "type": "object",
            "required": ["a", "list"],
            "properties": {
                "a": {"type": "string"},
                "maybe": {"type": ["string", "null"]},
                "gone": {"type": "string"},
                "list": {"type": "array", "items": {"$ref": "#/$defs/item"}},
            },
            "$defs": {"item": {"type": "object", "required": ["k"], "properties": {"k": {"type": "string"}, "v": {"type": "integer"}}}},
        });
        let l = lower(&author, Dialect::OpenAiStrict).expect("lowered");
        let text =
            r#"{"a":"x","maybe":null,"gone":null,"list":[{"k":"1","v":null},{"k":"2","v":3}]}"#;
        let back: Value = serde_json::from_str(&l.restore_text(text).expect("JSON")).expect("JSON");
        assert_eq!(
            back,
            json!({"a": "x", "maybe": null, "list": [{"k": "1"}, {"k": "2", "v": 3}]})
        );
        // The author's schema validates what is mapped back.
        assert!(jsonschema::is_valid(&author, &back));
        // A schema whose fields are all required needs no mapping.
        let plain = lower(
            &json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}}),
            Dialect::OpenAiStrict,
        )
        .expect("lowered");
        assert_eq!(plain.restore_text("{\"a\":null}"), None);
    }

    #[test]
    fn strict_refuses_maps_boolean_schemas_untyped_values_and_tuples() {
        assert_eq!(
            strict_refused(json!({"type": "object", "properties": {"meta": {"type": "object"}}})),
            [("/properties/meta".to_string(), "no maps")]
        );
        assert_eq!(
            strict_refused(
                json!({"type": "object", "properties": {"m": {"type": "object", "additionalProperties": {"type": "string"}}}})
            ),
            [("/properties/m/additionalProperties".to_string(), "no maps")]
        );
        assert_eq!(
            strict_refused(
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true})
            ),
            [(
                "/additionalProperties".to_string(),
                "additionalProperties false"
            )]
        );
        assert_eq!(
            strict_refused(json!({"type": "object", "properties": {"a": true}})),
            [("/properties/a".to_string(), "no boolean schemas")]
        );
        assert_eq!(
            strict_refused(
                json!({"type": "object", "properties": {"a": {"description": "anything"}}})
            ),
            [("/properties/a".to_string(), "a type on every node")]
        );
        assert_eq!(
            strict_refused(
                json!({"type": "object", "properties": {"t": {"type": "array", "prefixItems": [{"type": "string"}]}}})
            ),
            [("/properties/t".to_string(), "no tuples")]
        );
        assert_eq!(
            strict_refused(json!({"type": "array", "items": {"type": "string"}})),
            [(String::new(), "an object at the root")]
        );
        assert_eq!(
            strict_refused(
                json!({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"minLength": 2}]}}})
            ),
            [("/properties/a/allOf".to_string(), "no allOf")]
        );
    }

    #[test]
    fn strict_lowers_unions_refs_and_single_allof() {
        let l = strict(json!({
            "type": "object",
            "required": ["u", "r", "w"],
            "properties": {
                "u": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                "r": {"$ref": "#/$defs/x", "description": "dropped beside a ref"},
                "w": {"allOf": [{"$ref": "#/$defs/x"}], "description": "d"},
                "o": {"$ref": "#/$defs/x"},
            },
            "$defs": {"x": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}},
        }));
        assert_eq!(
            l["properties"]["u"],
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}]})
        );
        assert_eq!(l["properties"]["r"], json!({"$ref": "#/$defs/x"}));
        assert_eq!(l["properties"]["w"], json!({"$ref": "#/$defs/x"}));
        assert_eq!(
            l["properties"]["o"],
            json!({"anyOf": [{"$ref": "#/$defs/x"}, {"type": "null"}]})
        );
        assert_eq!(l["$defs"]["x"]["additionalProperties"], json!(false));
    }

    #[test]
    fn strict_enforces_the_documented_limits() {
        let mut s = json!({"type": "string"});
        for _ in 0..11 {
            s = json!({"type": "object", "required": ["n"], "properties": {"n": s}});
        }
        assert_eq!(
            strict_refused(s),
            [(String::new(), "at most 10 levels of nesting")]
        );
        let values: Vec<Value> = (0..1001).map(|i| json!(format!("v{i}"))).collect();
        let s = json!({"type": "object", "required": ["e"], "properties": {"e": {"type": "string", "enum": values}}});
        assert_eq!(
            strict_refused(s),
            [(String::new(), "at most 1,000 enum values")]
        );
    }

    #[test]
    fn every_shipped_schema_lowers_to_both_dialects() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("schemas/") {
            let path = entry.expect("an entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.ends_with(".schema.json") || name == "workflow.schema.json" {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            let schema: Value = serde_json::from_str(&text).expect("JSON");
            for d in [Dialect::Claude, Dialect::OpenAiStrict] {
                if let Err(r) = lower(&schema, d) {
                    panic!("{name} for {d:?}: {r:?}");
                }
            }
            seen += 1;
        }
        assert!(seen >= 10, "{seen} schemas");
    }
}
