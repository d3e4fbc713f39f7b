//! Reading what agents and servers print: typed, and forgiving.
//!
//! The structs that read an agent's output or a server's response declare the fields they
//! use and ignore the others; every field may be absent or `null`. A field whose value has
//! an unexpected type reads as absent too ([`lenient`]), so that one odd value never loses
//! the rest of an object: a usage count sent as a string counts zero, and the answer next to
//! it is still read.

use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, MapAccess, Visitor};
use serde_json::Value;

/// Reads a field, or its default when its value has another type than expected.
pub(super) fn lenient<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let value = Value::deserialize(deserializer)?;
    Ok(T::deserialize(value).unwrap_or_default())
}

/// The entries of a JSON object in their order (model names and their figures, say); an
/// entry whose value has an unexpected type holds the default.
#[derive(Debug)]
pub(super) struct Entries<T>(pub Vec<(String, T)>);

impl<T> Default for Entries<T> {
    fn default() -> Self {
        Entries(Vec::new())
    }
}

impl<'de, T: DeserializeOwned + Default> Deserialize<'de> for Entries<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object<T>(PhantomData<T>);

        impl<'de, T: DeserializeOwned + Default> Visitor<'de> for Object<T> {
            type Value = Entries<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, Value>()? {
                    entries.push((key, T::deserialize(value).unwrap_or_default()));
                }
                Ok(Entries(entries))
            }
        }

        deserializer.deserialize_map(Object(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, Deserialize)]
    #[serde(default)]
    struct Counts {
        #[serde(deserialize_with = "lenient")]
        n: Option<u64>,
        #[serde(deserialize_with = "lenient")]
        name: Option<String>,
        #[serde(deserialize_with = "lenient")]
        models: Entries<u64>,
    }

    #[test]
    fn odd_values_read_as_absent_and_the_rest_is_kept() {
        let c: Counts =
            serde_json::from_str(r#"{"n": "12", "name": "x", "other": [1]}"#).expect("an object");
        assert_eq!((c.n, c.name.as_deref()), (None, Some("x")));
        let c: Counts =
            serde_json::from_str(r#"{"n": null, "models": {"b": 2, "a": "?", "c": 3}}"#)
                .expect("an object");
        assert_eq!(c.n, None);
        let models: Vec<_> = c.models.0.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(models, [("b", 2), ("a", 0), ("c", 3)]);
        let c: Counts = serde_json::from_str(r#"{"models": [1, 2]}"#).expect("an object");
        assert!(c.models.0.is_empty());
    }
}
