//! Byte offsets and LSP positions (a line and a column in UTF-16 code units, or in bytes when
//! the client takes UTF-8), both ways, clamped: no position a client sends, and no span the
//! checker makes, turns into an out-of-range answer.

use lsp_types::{Position, Range};

/// How columns are counted, as agreed in `initialize` (`positionEncoding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Encoding {
    /// UTF-16 code units: the protocol's default, and what every client understands.
    #[default]
    Utf16,
    /// Bytes.
    Utf8,
}

/// Where each line of a text starts.
#[derive(Clone, Debug)]
pub(crate) struct LineIndex {
    starts: Vec<u32>,
    len: u32,
}

impl LineIndex {
    pub(crate) fn new(text: &str) -> LineIndex {
        let mut starts = vec![0];
        for (i, b) in text.bytes().enumerate() {
            if b == b'\n' {
                starts.push(u32::try_from(i + 1).unwrap_or(u32::MAX));
            }
        }
        LineIndex {
            starts,
            len: u32::try_from(text.len()).unwrap_or(u32::MAX),
        }
    }

    /// The position of a byte offset (clamped to the text, and back to a character boundary).
    pub(crate) fn position(&self, text: &str, offset: usize, enc: Encoding) -> Position {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = match self.starts.binary_search(&(offset as u32)) {
            Ok(l) => l,
            Err(l) => l - 1,
        };
        let start = self.starts[line] as usize;
        let piece = &text[start..offset];
        let col = match enc {
            Encoding::Utf8 => piece.len(),
            Encoding::Utf16 => piece.chars().map(char::len_utf16).sum(),
        };
        Position::new(line as u32, col as u32)
    }

    /// The range of a byte range.
    pub(crate) fn range(&self, text: &str, r: std::ops::Range<usize>, enc: Encoding) -> Range {
        Range::new(
            self.position(text, r.start, enc),
            self.position(text, r.end.max(r.start), enc),
        )
    }

    /// The byte offset of a position: a line past the end is the end of the text, a column
    /// past the end of its line is the line's end, and a column inside a character (half of
    /// a surrogate pair) is that character's start.
    pub(crate) fn offset(&self, text: &str, pos: Position, enc: Encoding) -> usize {
        let line = pos.line as usize;
        if line >= self.starts.len() {
            return self.len as usize;
        }
        let start = self.starts[line] as usize;
        let end = self
            .starts
            .get(line + 1)
            .map_or(text.len(), |&e| (e as usize).saturating_sub(1));
        let end = end.min(text.len()).max(start);
        let line_text = &text[start..end];
        let want = pos.character as usize;
        let mut units = 0;
        for (i, c) in line_text.char_indices() {
            if units >= want {
                return start + i;
            }
            units += match enc {
                Encoding::Utf8 => c.len_utf8(),
                Encoding::Utf16 => c.len_utf16(),
            };
            if units > want {
                return start + i;
            }
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_positions_round_trip_in_both_encodings() {
        let text = "a = \"é𝄞x\"\r\nb\n\nlast";
        let idx = LineIndex::new(text);
        for enc in [Encoding::Utf16, Encoding::Utf8] {
            for (off, _) in text.char_indices().chain([(text.len(), ' ')]) {
                let pos = idx.position(text, off, enc);
                let back = idx.offset(text, pos, enc);
                // `\r` before `\n` is part of the line; every char boundary round-trips.
                assert_eq!(back, off, "{enc:?} {off} {pos:?}");
            }
        }
        // 𝄞 is two UTF-16 units and four bytes.
        let after = text.find('x').unwrap_or(0);
        assert_eq!(
            idx.position(text, after, Encoding::Utf16),
            Position::new(0, 8)
        );
        assert_eq!(
            idx.position(text, after, Encoding::Utf8),
            Position::new(0, 11)
        );
    }

    #[test]
    fn positions_out_of_range_are_clamped() {
        let text = "ab\ncd";
        let idx = LineIndex::new(text);
        assert_eq!(idx.offset(text, Position::new(9, 0), Encoding::Utf16), 5);
        assert_eq!(idx.offset(text, Position::new(0, 99), Encoding::Utf16), 2);
        assert_eq!(idx.position(text, 99, Encoding::Utf16), Position::new(1, 2));
        // Inside a surrogate pair: the character's start.
        let text = "𝄞z";
        let idx = LineIndex::new(text);
        assert_eq!(idx.offset(text, Position::new(0, 1), Encoding::Utf16), 0);
        assert_eq!(idx.position(text, 2, Encoding::Utf8), Position::new(0, 0));
    }
}
