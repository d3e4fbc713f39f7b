//! `keywords!`: an enum of the words a file, the store or the screen uses for a fixed set of
//! values (extract modes, attempt states, ...), with `parse`, `as_str`, `NAMES`, `Display`
//! and serde as those words, so that nothing past the parser matches on strings.

/// Defines a keyword enum: `keywords! { pub enum Cleanup { OnSuccess = "on_success", ... } }`.
macro_rules! keywords {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every word, in declaration order.
            $vis const NAMES: &'static [&'static str] = &[$($text),+];

            /// Every value, in declaration order.
            $vis const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The value a word names.
            $vis fn parse(s: &str) -> Option<Self> {
                match s {
                    $( $text => Some(Self::$variant), )+
                    _ => None,
                }
            }

            /// The word, as written.
            $vis const fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $text, )+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let word = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::parse(&word)
                    .ok_or_else(|| serde::de::Error::unknown_variant(&word, Self::NAMES))
            }
        }
    };
}

#[cfg(test)]
mod tests {
    keywords! {
        /// A test enum.
        enum Colour {
            Red = "red",
            DarkBlue = "dark_blue",
        }
    }

    #[test]
    fn words_parse_print_and_serialize() {
        assert_eq!(Colour::parse("dark_blue"), Some(Colour::DarkBlue));
        assert_eq!(Colour::parse("Red"), None);
        assert_eq!(Colour::Red.to_string(), "red");
        assert_eq!(Colour::NAMES, &["red", "dark_blue"]);
        assert_eq!(Colour::ALL, &[Colour::Red, Colour::DarkBlue]);
        assert_eq!(
            serde_json::to_string(&Colour::DarkBlue).ok().as_deref(),
            Some("\"dark_blue\"")
        );
        assert_eq!(
            serde_json::from_str::<Colour>("\"red\"").ok(),
            Some(Colour::Red)
        );
        let err = serde_json::from_str::<Colour>("\"green\"")
            .map(drop)
            .map_err(|e| e.to_string());
        assert!(err.is_err_and(|e| e.contains("unknown variant `green`")));
    }
}
