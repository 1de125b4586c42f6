//! Masks Trainyard's own secrets in job logs as they are read: a job token (`tyj_`) or an API
//! token (`tyd_`) that a job prints is shown as `tyj_[masked]`, so that everyone who may read the
//! tenant's logs (viewers included) cannot act as the job or as a user. Logs are kept as the job
//! wrote them; every reading (the API, the dashboard, following, archived copies) goes through
//! [`LogMask`], in `logs.rs`.
//!
//! A token is masked in the forms a log line can carry it in: as written, in capitals, percent-
//! encoded (a URL, a query string), and base64-encoded (an `Authorization: Basic` header, a
//! serialised config) at any of the three offsets an encoder can meet it at.
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

/// A token as written, in any case, any of its characters percent-encoded.
static TOKEN: LazyLock<Regex> = LazyLock::new(|| {
    let prefix = r"(?:t|%74)(?:y|%79)(?:[dj]|%6[4a]|%4[4a])(?:_|%5f)";
    let digit = r"(?:[0-9a-f]|%3[0-9]|%6[1-6]|%4[1-6])";
    Regex::new(&format!(r"(?i)({prefix}){digit}{{{MIN_HEX},}}"))
        .unwrap_or_else(|err| panic!("the token pattern: {err}"))
});

/// A token in base64 (standard or URL-safe alphabet, with or without padding): the characters
/// that encode its prefix alone, at each of the three offsets from the start of what was
/// encoded, then the run of base64 that carries its digits.
static TOKEN_BASE64: LazyLock<Regex> = LazyLock::new(|| {
    use base64::Engine;
    let mut forms = Vec::new();
    for prefix in ["tyj_", "tyd_", "TYJ_", "TYD_"] {
        for lead in 0..3usize {
            let mut bytes = vec![0u8; lead];
            bytes.extend_from_slice(prefix.as_bytes());
            let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&bytes);
            // The characters whose six bits all come from the prefix.
            let stable = &encoded[(lead * 8).div_ceil(6)..(lead + 4) * 8 / 6];
            forms.push(regex::escape(stable));
            forms.push(regex::escape(&stable.replace('+', "-").replace('/', "_")));
        }
    }
    forms.sort();
    forms.dedup();
    Regex::new(&format!(r"(?:{})[A-Za-z0-9+/_-]{{{MIN_HEX},}}=*", forms.join("|")))
        .unwrap_or_else(|err| panic!("the base64 token pattern: {err}"))
});

/// The start of a token at the very end of the text: a prefix of `tyj_`/`tyd_`, or a whole
/// prefix and hex digits so far.
static OPEN_TAIL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)(?:t|ty|ty[dj]|ty[dj]_[0-9a-f]*)\z").unwrap_or_else(|err| panic!("the tail pattern: {err}"))
});

/// `text` with every token masked.
pub fn mask(text: &[u8]) -> Vec<u8> {
    let plain = TOKEN.replace_all(text, |caps: &regex::bytes::Captures| {
        let mut out = caps[1].to_vec();
        out.extend_from_slice(MASKED);
        out
    });
    TOKEN_BASE64.replace_all(&plain, MASKED).into_owned()
}

/// Masking over a stream of chunks.
#[derive(Debug, Default)]
pub struct LogMask {
    /// The tail of what came so far that may be the start of a token.
    held: Vec<u8>,
}

impl LogMask {
    /// Masks what can be told now. Holds back the unfinished last line, so that a token in any
    /// of its forms is masked whole (a line too long to hold: a tail that may continue as a
    /// plain token).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut text = std::mem::take(&mut self.held);
        text.extend_from_slice(chunk);
        let line_start = memchr::memrchr(b'\n', &text).map_or(0, |at| at + 1);
        let keep_from = if text.len() - line_start <= MAX_HELD {
            line_start
        } else {
            OPEN_TAIL.find(&text).map_or(text.len(), |tail| tail.start())
        };
        if text.len() - keep_from <= MAX_HELD {
            self.held = text.split_off(keep_from);
        }
        mask(&text)
    }

    /// When the stream pauses: lets go of the held line, masked, but for a plain token's start
    /// with secret characters (more than "tyj_"), which waits for more or for
    /// [`LogMask::finish`].
    pub fn flush_idle(&mut self) -> Vec<u8> {
        let keep_from =
            OPEN_TAIL.find(&self.held).filter(|tail| tail.len() > 4).map_or(self.held.len(), |tail| tail.start());
        let open = self.held.split_off(keep_from);
        mask(&std::mem::replace(&mut self.held, open))
    }

    /// At the end of the stream: everything held, masked, with a token's start masked too.
    pub fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        let keep_from = OPEN_TAIL.find(&held).map_or(held.len(), |tail| tail.start());
        let mut out = mask(&held[..keep_from]);
        let tail = &held[keep_from..];
        if tail.len() > 4 {
            out.extend_from_slice(&tail[..4]);
            out.extend_from_slice(MASKED);
        } else {
            out.extend_from_slice(tail);
        }
        out
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

    /// The forms a viewer found in a log and used to act as the job: none survives.
    #[test]
    fn tokens_in_capitals_percent_encoding_and_base64_are_masked() {
        use base64::Engine;
        let engines = [base64::engine::general_purpose::STANDARD, base64::engine::general_purpose::URL_SAFE_NO_PAD];
        let percent: String = JOB.bytes().map(|b| format!("%{b:02X}")).collect();
        let mut forms = vec![JOB.to_uppercase(), percent, JOB.replace('_', "%5F")];
        for engine in &engines {
            for lead in ["", "a", "ab", "Bearer:"] {
                forms.push(engine.encode(format!("{lead}{JOB}")));
            }
        }
        for form in forms {
            let line = format!("export X={form} # done\n");
            let masked = String::from_utf8(mask(line.as_bytes())).unwrap();
            assert!(masked.contains("[masked]") && masked.ends_with(" # done\n"), "{form}: {masked}");
            assert!(!masked.to_lowercase().contains(&JOB[4..20]), "{form}: {masked}");
            for engine in &engines {
                // Nothing that decodes to a run of the token's digits is left.
                for word in masked.split(|c: char| !(c.is_ascii_alphanumeric() || "+/_-=".contains(c))) {
                    if let Ok(bytes) = engine.decode(word.trim_end_matches('=')) {
                        assert!(!String::from_utf8_lossy(&bytes).contains(&JOB[10..26]), "{form}: {masked}");
                    }
                }
            }
        }
        // Ordinary base64 and hex stay as they are.
        let text = "sha256:0123456789abcdef0123 aGVsbG8gd29ybGQgaGVsbG8gd29ybGQ=";
        assert_eq!(String::from_utf8(mask(text.as_bytes())).unwrap(), text);
    }

    #[test]
    fn a_token_split_between_chunks_is_still_masked() {
        use base64::Engine;
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("u:{JOB}"));
        let text = format!("step 1 {JOB} done\nauth {encoded} ok\n");
        for at in 0..text.len() {
            let (a, b) = text.as_bytes().split_at(at);
            assert_eq!(streamed(&[a, b]), mask(text.as_bytes()), "split at {at}");
        }
    }

    #[test]
    fn an_idle_stream_shows_whole_lines_at_once_and_holds_secret_digits() {
        let mut mask = LogMask::default();
        assert_eq!(mask.push(b"step 1\nrestart"), b"step 1\n", "whole lines at once");
        assert_eq!(mask.flush_idle(), b"restart", "the unfinished line when the stream pauses");
        assert_eq!(mask.push(b"token tyj_0123"), b"");
        assert_eq!(mask.flush_idle(), b"token ", "hex digits after the prefix wait");
        assert_eq!(mask.flush_idle(), b"");
        assert_eq!(mask.finish(), b"tyj_[masked]");
    }

    #[test]
    fn endless_hex_after_a_prefix_is_not_held_forever() {
        let mut mask = LogMask::default();
        let out = mask.push(format!("tyj_{}", "a".repeat(5000)).as_bytes());
        assert_eq!(out, b"tyj_[masked]");
        assert_eq!(mask.push(b"aaaa and on\n"), b"aaaa and on\n");
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
