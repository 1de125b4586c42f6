//! Masks Trainyard's own secrets in job logs as they are read: a job token (`tyj_`) or an API
//! token (`tyd_`) that a job prints is shown as `tyj_[masked]`, so that everyone who may read the
//! tenant's logs (viewers included) cannot act as the job or as a user. Logs are kept as the job
//! wrote them; every reading (the API, the dashboard, following, archived copies) goes through
//! [`LogMask`], in `logs.rs`.
//!
//! Reading is a stream of chunks, and a token may be split between two. [`LogMask::push`] holds
//! back a tail that may be the start of a token until the next chunk says what it is;
//! [`LogMask::flush_idle`] lets go of a held tail that carries no secret characters yet (so a
//! follower sees a line ending in "t" without waiting), and [`LogMask::finish`] lets go of
//! everything at the end of the stream, masking what could be part of a token.

use std::sync::LazyLock;

use regex::bytes::Regex;

/// A token's prefix, and at least this many of its hex digits, is masked (a token has 64; a
/// shorter run is still too much of one to show).
const MIN_HEX: usize = 16;

/// What a masked token shows.
const MASKED: &[u8] = b"[masked]";

/// The longest tail held back: past this, a run of hex digits is no token (those have 64), and
/// what is held is let go (masked).
const MAX_HELD: usize = 1024;

static TOKEN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"(ty[dj]_)[0-9a-f]{{{MIN_HEX},}}")).unwrap_or_else(|err| panic!("the token pattern: {err}"))
});

/// The start of a token at the very end of the text: a prefix of `tyj_`/`tyd_`, or a whole
/// prefix and hex digits so far.
static OPEN_TAIL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:t|ty|ty[dj]|ty[dj]_[0-9a-f]*)\z").unwrap_or_else(|err| panic!("the tail pattern: {err}"))
});

/// `text` with every token masked.
pub fn mask(text: &[u8]) -> Vec<u8> {
    TOKEN
        .replace_all(text, |caps: &regex::bytes::Captures| {
            let mut out = caps[1].to_vec();
            out.extend_from_slice(MASKED);
            out
        })
        .into_owned()
}

/// Masking over a stream of chunks.
#[derive(Debug, Default)]
pub struct LogMask {
    /// The tail of what came so far that may be the start of a token.
    held: Vec<u8>,
}

impl LogMask {
    /// Masks what can be told now; holds back a tail that may continue as a token.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut text = std::mem::take(&mut self.held);
        text.extend_from_slice(chunk);
        // A token that reaches the end (or its start) may go on in the next chunk: hold it back.
        let keep_from = OPEN_TAIL.find(&text).map_or(text.len(), |tail| tail.start());
        if text.len() - keep_from <= MAX_HELD {
            self.held = text.split_off(keep_from);
        }
        mask(&text)
    }

    /// When the stream pauses: lets go of a held tail that has no secret characters yet (at
    /// most "tyj_"); a tail with hex digits waits for more, or for [`LogMask::finish`].
    pub fn flush_idle(&mut self) -> Vec<u8> {
        if self.held.len() <= 4 { std::mem::take(&mut self.held) } else { Vec::new() }
    }

    /// At the end of the stream: everything held, with a token's start masked.
    pub fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        if held.len() > 4 {
            let mut out = held[..4].to_vec();
            out.extend_from_slice(MASKED);
            out
        } else {
            held
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const JOB: &str = "tyj_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const API: &str = "tyd_fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    fn streamed(chunks: &[&[u8]]) -> Vec<u8> {
        let mut mask = LogMask::default();
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(mask.push(chunk));
        }
        out.extend(mask.finish());
        out
    }

    #[test]
    fn tokens_are_masked_and_everything_else_is_kept() {
        let text = format!("TRAINYARD_JOB_TOKEN={JOB}\nauth: Bearer {API}, tyj_short ok\ntype_ty");
        let masked = String::from_utf8(mask(text.as_bytes())).unwrap();
        assert_eq!(masked, "TRAINYARD_JOB_TOKEN=tyj_[masked]\nauth: Bearer tyd_[masked], tyj_short ok\ntype_ty");
    }

    #[test]
    fn a_token_split_between_chunks_is_still_masked() {
        let text = format!("step 1 {JOB} done\n");
        for at in 0..text.len() {
            let (a, b) = text.as_bytes().split_at(at);
            assert_eq!(streamed(&[a, b]), mask(text.as_bytes()), "split at {at}");
        }
    }

    #[test]
    fn an_idle_stream_shows_ordinary_text_at_once_and_holds_secret_digits() {
        let mut mask = LogMask::default();
        assert_eq!(mask.push(b"restart"), b"restar");
        assert_eq!(mask.flush_idle(), b"t", "a lone 't' is no secret");
        assert_eq!(mask.push(b"token tyj_0123"), b"token ");
        assert_eq!(mask.flush_idle(), b"", "hex digits after the prefix wait");
        assert_eq!(mask.finish(), b"tyj_[masked]");
    }

    #[test]
    fn endless_hex_after_a_prefix_is_not_held_forever() {
        let mut mask = LogMask::default();
        let out = mask.push(format!("tyj_{}", "a".repeat(5000)).as_bytes());
        assert_eq!(out, b"tyj_[masked]");
        assert_eq!(mask.push(b"aaaa and on"), b"aaaa and on");
    }

    proptest! {
        #[test]
        fn no_split_of_a_log_shows_any_part_of_a_token(
            before in "[a-z =\n]{0,40}",
            after in "[a-z0-9 =\n]{0,40}",
            cuts in proptest::collection::vec(0usize..200, 0..6),
        ) {
            let text = format!("{before}{JOB}{after}{API}");
            let bytes = text.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort();
            let mut chunks = Vec::new();
            let mut from = 0;
            for cut in cuts {
                chunks.push(&bytes[from..cut]);
                from = cut;
            }
            chunks.push(&bytes[from..]);
            let out = streamed(&chunks);
            prop_assert_eq!(&out, &mask(bytes));
            let out = String::from_utf8(out).unwrap();
            prop_assert!(!out.contains(&JOB[4..20]) && !out.contains(&API[4..20]), "{}", out);
        }
    }
}
