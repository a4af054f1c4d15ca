//! The last bytes of a child's output stream, kept for the history entry of a run that failed.
//!
//! A ring of at most `limit` bytes, fed with every chunk the output reader takes from the pipe: a job
//! printing gigabytes costs the worker `limit` bytes, and one printing nothing costs no allocation at all
//! (the ring allocates on its first byte). The text is cut on a UTF-8 boundary when the ring has dropped
//! the start of a character, and invalid bytes are replaced (lossy), so it is always a valid string.

use std::collections::VecDeque;

/// The last `limit` bytes written to it.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    limit: usize,
    bytes: VecDeque<u8>,
    /// Whether bytes were dropped from the front: the first kept byte may be inside a character.
    cut: bool,
}

impl Tail {
    /// A tail of at most `limit` bytes; 0 keeps nothing.
    pub(crate) fn new(limit: usize) -> Tail {
        Tail {
            limit,
            bytes: VecDeque::new(),
            cut: false,
        }
    }

    /// Appends `chunk`, dropping what falls out of the last `limit` bytes.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        if self.limit == 0 || chunk.is_empty() {
            return;
        }
        if self.bytes.capacity() == 0 {
            // Exactly the bound, once: growing by doubling could hold almost twice `limit`.
            self.bytes.reserve_exact(self.limit);
        }
        if chunk.len() >= self.limit {
            self.cut |= chunk.len() > self.limit || !self.bytes.is_empty();
            self.bytes.clear();
            self.bytes.extend(&chunk[chunk.len() - self.limit..]);
            return;
        }
        let over = (self.bytes.len() + chunk.len()).saturating_sub(self.limit);
        if over > 0 {
            self.bytes.drain(..over);
            self.cut = true;
        }
        self.bytes.extend(chunk);
    }

    /// The kept bytes as text (lossy), from the first whole character; `None` when nothing was kept.
    pub(crate) fn text(&self) -> Option<String> {
        let (front, back) = self.bytes.as_slices();
        let mut bytes = Vec::with_capacity(self.bytes.len());
        bytes.extend_from_slice(front);
        bytes.extend_from_slice(back);
        let start = if self.cut {
            // A UTF-8 character has at most 3 continuation bytes (0b10xx_xxxx) after its lead byte.
            bytes
                .iter()
                .take(3)
                .take_while(|b| (**b & 0xC0) == 0x80)
                .count()
        } else {
            0
        };
        let text = String::from_utf8_lossy(&bytes[start..]);
        (!text.is_empty()).then(|| text.into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail(limit: usize, chunks: &[&[u8]]) -> Tail {
        let mut tail = Tail::new(limit);
        for chunk in chunks {
            tail.push(chunk);
        }
        tail
    }

    /// Only the last `limit` bytes are kept, however the output arrives, and never more memory.
    #[test]
    fn keeps_the_last_limit_bytes() {
        let whole: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let expected = String::from_utf8(whole[whole.len() - 100..].to_vec()).expect("ascii");
        for size in [1, 7, 99, 100, 101, 1024, 10_000] {
            let chunks: Vec<&[u8]> = whole.chunks(size).collect();
            let kept = tail(100, &chunks);
            assert_eq!(
                kept.text().as_deref(),
                Some(expected.as_str()),
                "chunks of {size}"
            );
            assert!(
                kept.bytes.capacity() < 200,
                "chunks of {size}: {}",
                kept.bytes.capacity()
            );
        }
        assert_eq!(tail(100, &[b"short"]).text().as_deref(), Some("short"));
        assert_eq!(
            tail(5, &[b"ab", b"cd", b"efg"]).text().as_deref(),
            Some("cdefg")
        );
    }

    /// A cut inside a character drops its remains; invalid bytes become U+FFFD; whole text is kept whole.
    #[test]
    fn cuts_on_a_utf8_boundary() {
        // "é" is 2 bytes, "€" 3: the last 5 bytes of "aé€x" start inside "é".
        let text = "aé€x".as_bytes();
        assert_eq!(tail(5, &[text]).text().as_deref(), Some("€x"));
        assert_eq!(tail(4, &[text]).text().as_deref(), Some("€x"));
        assert_eq!(tail(3, &[text]).text().as_deref(), Some("x"));
        assert_eq!(tail(7, &[text]).text().as_deref(), Some("aé€x"));
        assert_eq!(tail(10, &[b"x\xffy"]).text().as_deref(), Some("x\u{FFFD}y"));
        // Continuation bytes at the very start of a stream that was not cut are the job's, replaced.
        assert_eq!(tail(10, &[b"\x80a"]).text().as_deref(), Some("\u{FFFD}a"));
    }

    /// A limit of 0 keeps nothing and allocates nothing; a stream that printed nothing has no tail.
    #[test]
    fn zero_is_off_and_silence_is_none() {
        let off = tail(0, &[b"anything"]);
        assert_eq!(off.text(), None);
        assert_eq!(off.bytes.capacity(), 0);
        let quiet = tail(2048, &[]);
        assert_eq!(quiet.text(), None);
        assert_eq!(quiet.bytes.capacity(), 0);
    }
}
