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

/// Where each line of a text starts. Lines end as the protocol says: at `\n`, `\r\n` or a
/// lone `\r`; a position never points into a line's end.
#[derive(Clone, Debug)]
pub(crate) struct LineIndex {
    starts: Vec<u32>,
    len: u32,
}

impl LineIndex {
    pub(crate) fn new(text: &str) -> LineIndex {
        let mut starts = vec![0];
        let bytes = text.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            if b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n')) {
                starts.push(u32::try_from(i + 1).unwrap_or(u32::MAX));
            }
        }
        LineIndex {
            starts,
            len: u32::try_from(text.len()).unwrap_or(u32::MAX),
        }
    }

    /// Where a line's text starts and ends (before its line end).
    fn line_bounds(&self, text: &str, line: usize) -> (usize, usize) {
        let start = (self.starts[line] as usize).min(text.len());
        let end = match self.starts.get(line + 1) {
            None => text.len(),
            Some(&next) => {
                let next = (next as usize).min(text.len());
                let bytes = text.as_bytes();
                let mut end = next.saturating_sub(1);
                if bytes.get(end) == Some(&b'\n') && end > 0 && bytes.get(end - 1) == Some(&b'\r') {
                    end -= 1;
                }
                end
            }
        };
        (start, end.max(start))
    }

    /// The position of a byte offset (clamped to the text, back to a character boundary, and
    /// out of a line end).
    pub(crate) fn position(&self, text: &str, offset: usize, enc: Encoding) -> Position {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = match self.starts.binary_search(&(offset as u32)) {
            Ok(l) => l,
            Err(l) => l.saturating_sub(1),
        };
        let line = line.min(self.starts.len() - 1);
        let (start, end) = self.line_bounds(text, line);
        let piece = &text[start..offset.clamp(start, end)];
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
            return (self.len as usize).min(text.len());
        }
        let (start, end) = self.line_bounds(text, line);
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
                if text[..off].ends_with('\r') && text[off..].starts_with('\n') {
                    // Inside a line end: its line's end.
                    assert_eq!(back, off - 1, "{enc:?} {off} {pos:?}");
                } else {
                    // Every other char boundary round-trips.
                    assert_eq!(back, off, "{enc:?} {off} {pos:?}");
                }
            }
        }
        // 𝄞 is two UTF-16 units and four bytes: `x` is after 8 units (`a = "` 5, `é` 1).
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
    fn lines_end_at_lf_crlf_and_a_lone_cr() {
        let text = "a\rbc\r\nd\ne";
        let idx = LineIndex::new(text);
        let at = |off| idx.position(text, off, Encoding::Utf16);
        assert_eq!(at(2), Position::new(1, 0));
        assert_eq!(at(4), Position::new(1, 2));
        // Between `\r` and `\n`: the line's end, not a column past it.
        assert_eq!(at(5), Position::new(1, 2));
        assert_eq!(at(6), Position::new(2, 0));
        assert_eq!(at(8), Position::new(3, 0));
        assert_eq!(idx.offset(text, Position::new(1, 9), Encoding::Utf16), 4);
        assert_eq!(idx.offset(text, Position::new(0, 9), Encoding::Utf16), 1);
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
