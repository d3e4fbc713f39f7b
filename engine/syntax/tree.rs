//! The syntax tree both file formats parse into: tables, arrays and scalars, each with its span.

use crate::source::Span;

/// A value read from a workflow file.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub span: Span,
    pub kind: ValueKind,
}

/// The shape of a [`Value`].
#[derive(Clone, Debug, PartialEq)]
pub enum ValueKind {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Array(Vec<Value>),
    Table(Table),
}

/// An ordered table of keyed values.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Table {
    pub entries: Vec<Entry>,
}

/// One `key = value` of a table.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub key: String,
    pub key_span: Span,
    pub value: Value,
}

impl Table {
    /// Returns the entry with the given key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|e| e.key == key).map(|e| &e.value)
    }

    /// Returns the whole entry with the given key.
    pub fn entry(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// Inserts or replaces an entry, keeping the position of a replaced one.
    pub fn insert(&mut self, entry: Entry) {
        match self.entries.iter_mut().find(|e| e.key == entry.key) {
            Some(e) => *e = entry,
            None => self.entries.push(entry),
        }
    }
}

impl Value {
    /// Creates a value.
    pub fn new(span: Span, kind: ValueKind) -> Self {
        Value { span, kind }
    }

    /// Names the type of the value as users know it.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            ValueKind::Str(_) => "a string",
            ValueKind::Int(_) => "an integer",
            ValueKind::Float(_) => "a float",
            ValueKind::Bool(_) => "a boolean",
            ValueKind::Array(_) => "an array",
            ValueKind::Table(_) => "a table",
        }
    }

    /// Returns the string, if the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            ValueKind::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Returns the table, if the value is one.
    pub fn as_table(&self) -> Option<&Table> {
        match &self.kind {
            ValueKind::Table(t) => Some(t),
            _ => None,
        }
    }

    /// Returns the array, if the value is one.
    pub fn as_array(&self) -> Option<&[Value]> {
        match &self.kind {
            ValueKind::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Returns the integer, if the value is one.
    pub fn as_int(&self) -> Option<i64> {
        match self.kind {
            ValueKind::Int(i) => Some(i),
            _ => None,
        }
    }

    /// Returns the boolean, if the value is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self.kind {
            ValueKind::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// Converts the value into JSON (for params, schemas and inline data).
    pub fn to_json(&self) -> serde_json::Value {
        match &self.kind {
            ValueKind::Str(s) => serde_json::Value::String(s.clone()),
            ValueKind::Int(i) => serde_json::Value::from(*i),
            ValueKind::Float(f) => serde_json::Number::from_f64(*f)
                .map_or(serde_json::Value::Null, serde_json::Value::Number),
            ValueKind::Bool(b) => serde_json::Value::Bool(*b),
            ValueKind::Array(a) => serde_json::Value::Array(a.iter().map(Value::to_json).collect()),
            ValueKind::Table(t) => serde_json::Value::Object(
                t.entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.to_json()))
                    .collect(),
            ),
        }
    }

    /// Converts JSON into a value with the given span (nulls are dropped from tables and arrays).
    pub fn from_json(json: &serde_json::Value, span: Span) -> Option<Value> {
        let kind = match json {
            serde_json::Value::Null => return None,
            serde_json::Value::Bool(b) => ValueKind::Bool(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => ValueKind::Int(i),
                None => ValueKind::Float(n.as_f64()?),
            },
            serde_json::Value::String(s) => ValueKind::Str(s.clone()),
            serde_json::Value::Array(a) => {
                ValueKind::Array(a.iter().filter_map(|v| Value::from_json(v, span)).collect())
            }
            serde_json::Value::Object(o) => ValueKind::Table(Table {
                entries: o
                    .iter()
                    .filter_map(|(k, v)| {
                        Some(Entry {
                            key: k.clone(),
                            key_span: span,
                            value: Value::from_json(v, span)?,
                        })
                    })
                    .collect(),
            }),
        };
        Some(Value { span, kind })
    }
}
