//! The function-length check: a function body over [`WARN_LINES`] lines is reported as a
//! warning, one over [`MAX_FN_LINES`] fails unless [`FN_ALLOWED`] names it with a reason.
//!
//! Functions are found by a small lexer, not a parser: code with comments, strings
//! (plain, byte and raw), char literals and lifetimes removed, then `fn NAME` followed by
//! a body in braces, counted from the `fn` line to its closing brace. A declaration ending
//! in `;` (a trait method without a default) has no body and is skipped. Test code is
//! skipped as the file-size check skips it.

/// A body this long is worth splitting into named steps: a warning.
pub const WARN_LINES: usize = 80;

/// Longest function allowed without an entry in [`FN_ALLOWED`].
pub const MAX_FN_LINES: usize = 150;

/// Functions allowed over [`MAX_FN_LINES`] (`path::name`), each with the reason.
pub const FN_ALLOWED: &[(&str, &str)] = &[
    (
        "hmc-rpc/examples/device_staged.rs::run",
        "an example read top to bottom: the GPU check's steps in order, each printed",
    ),
    (
        "hmc-core/src/testing/cases.rs::communicator_cases",
        "the conformance kit as data: one table of cases, one entry per case",
    ),
];

/// A function body found in a file: its name, first line (1-based) and length in lines.
#[derive(Debug, PartialEq, Eq)]
pub struct Function {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// Lexer state carried from one line to the next.
#[derive(Default)]
struct Lex {
    block_comment: usize,
    string: bool,
    /// Inside a raw string closed by `"` and this many `#`.
    raw: Option<usize>,
}

/// `line` with comments, string contents and char literals removed.
fn code_of(line: &str, st: &mut Lex) -> String {
    let b: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        let at = |k: usize| b.get(i + k).copied();
        if st.block_comment > 0 {
            if at(0) == Some('*') && at(1) == Some('/') {
                st.block_comment -= 1;
                i += 2;
            } else if at(0) == Some('/') && at(1) == Some('*') {
                st.block_comment += 1;
                i += 2;
            } else {
                i += 1;
            }
            continue;
        }
        if let Some(hashes) = st.raw {
            if b[i] == '"' && (1..=hashes).all(|k| at(k) == Some('#')) {
                st.raw = None;
                i += 1 + hashes;
            } else {
                i += 1;
            }
            continue;
        }
        if st.string {
            match b[i] {
                '\\' => i += 2,
                '"' => {
                    st.string = false;
                    i += 1;
                }
                _ => i += 1,
            }
            continue;
        }
        let c = b[i];
        let word_before = i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_');
        if c == '/' && at(1) == Some('/') {
            break;
        }
        if c == '/' && at(1) == Some('*') {
            st.block_comment = 1;
            i += 2;
            continue;
        }
        // Raw strings: r"…", r#"…"#, br"…".
        if !word_before && (c == 'r' || (c == 'b' && at(1) == Some('r'))) {
            let start = if c == 'b' { i + 2 } else { i + 1 };
            let mut j = start;
            while b.get(j) == Some(&'#') {
                j += 1;
            }
            if b.get(j) == Some(&'"') {
                st.raw = Some(j - start);
                i = j + 1;
                continue;
            }
        }
        if c == '"' {
            st.string = true;
            i += 1;
            continue;
        }
        if c == '\'' {
            // A char literal ('x', '\n', '\u{..}', '\''); otherwise a lifetime.
            if at(1) == Some('\\') {
                let mut j = i + 2;
                while j < b.len() && !(b[j] == '\'' && j > i + 2) {
                    j += 1;
                }
                i = j + 1;
                continue;
            }
            if at(2) == Some('\'') {
                i += 3;
                continue;
            }
            i += 1;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

/// The name of the function whose signature starts on this (code-only) line.
fn fn_name(code: &str) -> Option<&str> {
    let mut words = code.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let w = w.split('(').next().unwrap_or(w);
        let keyword = matches!(
            w,
            "pub" | "const" | "async" | "unsafe" | "extern" | "default"
        ) || w.starts_with("pub(")
            || w.starts_with('"');
        if w == "fn" {
            let name = words.next()?;
            let end = name
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            return (end > 0).then(|| &name[..end]);
        }
        if !keyword {
            return None;
        }
    }
    None
}

/// The code of the first `end` lines of `lines`, comments, strings and char literals
/// removed, one entry per line.
pub(crate) fn code_lines(lines: &[&str], end: usize) -> Vec<String> {
    let mut st = Lex::default();
    lines[..end.min(lines.len())]
        .iter()
        .map(|l| code_of(l, &mut st))
        .collect()
}

/// Every function with a body in the first `end` lines of `lines`.
pub fn functions(lines: &[&str], end: usize) -> Vec<Function> {
    let mut st = Lex::default();
    let code: Vec<String> = lines.iter().map(|l| code_of(l, &mut st)).collect();
    let mut out = Vec::new();
    for i in 0..end.min(code.len()) {
        let Some(name) = fn_name(&code[i]) else {
            continue;
        };
        // The body's opening brace, unless a `;` ends a declaration first.
        let mut depth = 0i64;
        let mut opened = false;
        let mut close = None;
        'lines: for (j, c) in code.iter().enumerate().skip(i) {
            for ch in c.chars() {
                match ch {
                    ';' if !opened => break 'lines,
                    '{' => {
                        opened = true;
                        depth += 1;
                    }
                    '}' if opened => {
                        depth -= 1;
                        if depth == 0 {
                            close = Some(j);
                            break 'lines;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(j) = close {
            out.push(Function {
                name: name.to_string(),
                line: i + 1,
                lines: j - i + 1,
            });
        }
    }
    out
}

/// Whether `path::name` is in [`FN_ALLOWED`].
pub fn allowed(path: &str, name: &str) -> bool {
    FN_ALLOWED
        .iter()
        .any(|(p, _)| p.rsplit_once("::") == Some((path, name)))
}
