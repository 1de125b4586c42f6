//! Names inside shards. WebDataset splits a member name at the first dot of its last path
//! component: `a/b/x.seg.png` is key `a/b/x` and extension `seg.png`, and its reader lowercases
//! extensions. `wids` reads only the 100-byte ustar name field, so a name must fit in 99 bytes.

/// The longest member name every reader handles (ustar `name` field, NUL-terminated).
pub const MAX_MEMBER_NAME: usize = 99;

/// `(key, extension)` of a member name, or `None` when the name has no extension (WebDataset
/// cannot group such a file into a sample).
pub fn split_key(name: &str) -> Option<(&str, &str)> {
    let last_slash = name.rfind('/').map_or(0, |i| i + 1);
    let dot = name[last_slash..].find('.')? + last_slash;
    if dot == last_slash {
        // `.hidden`: the key's last component would be empty.
        return None;
    }
    let (key, ext) = (&name[..dot], &name[dot + 1..]);
    if ext.is_empty() { None } else { Some((key, ext)) }
}

/// Why `name` cannot be a member as-is, if it cannot.
pub fn member_name_problem(name: &str) -> Option<String> {
    if name.len() > MAX_MEMBER_NAME {
        return Some(format!(
            "{name}: the name is {} bytes; tar readers (wids) take at most {MAX_MEMBER_NAME}; shorten the path",
            name.len()
        ));
    }
    if name.contains('\\') || name.chars().any(char::is_control) {
        return Some(format!("{name:?}: a member name may not hold backslashes or control characters"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_the_first_dot_of_the_last_component() {
        assert_eq!(split_key("x.seg.png"), Some(("x", "seg.png")));
        assert_eq!(split_key("a.b/c/x.jpg"), Some(("a.b/c/x", "jpg")));
        assert_eq!(split_key("a/README"), None);
        assert_eq!(split_key("a/.hidden"), None);
        assert_eq!(split_key("x."), None);
    }

    #[test]
    fn long_names_are_refused_with_a_reason() {
        assert!(member_name_problem(&"a".repeat(99)).is_none());
        assert!(member_name_problem(&"a".repeat(100)).unwrap().contains("at most 99"));
        assert!(member_name_problem("a\nb.txt").is_some());
    }
}
