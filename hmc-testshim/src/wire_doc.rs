//! The examples of `docs/wire.md`, for the transports' tests that decode them: a block
//! after `<!-- wire-example: NAME -->` of hex bytes, `#` starting a comment.

use std::path::PathBuf;

/// The workspace's `docs/wire.md`.
pub fn wire_doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/wire.md")
}

/// The bytes of the example `name` in `text` (a wire.md), or why there are none.
pub fn example_in(text: &str, name: &str) -> Result<Vec<u8>, String> {
    let marker = format!("<!-- wire-example: {name} -->");
    let start = text
        .find(&marker)
        .ok_or_else(|| format!("no example `{name}` in docs/wire.md"))?;
    let rest = &text[start + marker.len()..];
    let open = rest
        .find("```")
        .ok_or_else(|| format!("example `{name}` has no code block"))?;
    let body = &rest[open + 3..];
    let body = &body[body.find('\n').map_or(0, |i| i + 1)..];
    let close = body
        .find("```")
        .ok_or_else(|| format!("example `{name}`'s code block is not closed"))?;
    let mut bytes = Vec::new();
    for line in body[..close].lines() {
        let hex = line.split('#').next().unwrap_or("");
        for word in hex.split_whitespace() {
            let b = u8::from_str_radix(word, 16)
                .map_err(|_| format!("example `{name}`: `{word}` is not a hex byte"))?;
            bytes.push(b);
        }
    }
    if bytes.is_empty() {
        return Err(format!("example `{name}` has no bytes"));
    }
    Ok(bytes)
}

/// The bytes of the example `name` in the workspace's `docs/wire.md`; panics saying what is
/// missing (for tests).
pub fn wire_example(name: &str) -> Vec<u8> {
    let path = wire_doc_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    example_in(&text, name).unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_are_hex_bytes_with_comments() {
        let doc =
            "x\n<!-- wire-example: a -->\n```text\n01 ff  # one, 255\n# only a comment\n0a\n```\n";
        assert_eq!(example_in(doc, "a").unwrap(), [1, 255, 10]);
        assert!(example_in(doc, "b").unwrap_err().contains("no example `b`"));
        let bad = "<!-- wire-example: a -->\n```\nzz\n```\n";
        assert!(example_in(bad, "a").unwrap_err().contains("`zz`"));
    }

    #[test]
    fn every_example_of_the_workspace_doc_parses() {
        let text = std::fs::read_to_string(wire_doc_path()).unwrap();
        let names: Vec<&str> = text
            .match_indices("<!-- wire-example: ")
            .map(|(i, m)| {
                let rest = &text[i + m.len()..];
                &rest[..rest.find(" -->").unwrap()]
            })
            .collect();
        assert!(names.len() >= 6, "{names:?}");
        for n in names {
            example_in(&text, n).unwrap();
        }
    }
}
