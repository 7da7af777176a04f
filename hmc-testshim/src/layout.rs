//! Binding checks against C headers: compiles and runs a small C program that prints the C value of each item a Rust binding declares (`sizeof T`, `offsetof T.field`, `const NAME`), for the layout tests of the transports that load their library at run time.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// The C expression for a key of the form `sizeof T`, `offsetof T.field` (split at the
/// first `.`) or `const NAME`.
pub fn c_expr(key: &str) -> String {
    if let Some(ty) = key.strip_prefix("sizeof ") {
        return format!("sizeof({ty})");
    }
    if let Some(name) = key.strip_prefix("const ") {
        return name.to_string();
    }
    let rest = key
        .strip_prefix("offsetof ")
        .unwrap_or_else(|| panic!("`{key}` is not sizeof/offsetof/const"));
    let (ty, field) = rest.split_once('.').expect("offsetof T.field");
    format!("offsetof({ty}, {field})")
}

/// Compiles a program including `header` (with `-I include`; the compiler is `$CC` or
/// `cc`), runs it, and returns the C value of every key. `expr` gives a key's C expression
/// where [`c_expr`]'s default form does not fit. Panics (failing the test) with the
/// compiler's output when it does not build.
pub fn c_values(
    include: &Path,
    header: &str,
    keys: &[&str],
    expr: impl Fn(&str) -> Option<String>,
) -> HashMap<String, i64> {
    let mut src = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include <{header}>\nint main(void) {{\n"
    );
    for key in keys {
        let e = expr(key).unwrap_or_else(|| c_expr(key));
        src += &format!("  printf(\"%lld {key}\\n\", (long long)({e}));\n");
    }
    src += "  return 0;\n}\n";
    let dir = tempfile::tempdir().expect("temp dir");
    let (c, exe) = (dir.path().join("layout.c"), dir.path().join("layout"));
    std::fs::write(&c, src).expect("write the C program");
    let cc = crate::c_compiler();
    let out = Command::new(&cc)
        .arg("-I")
        .arg(include)
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("run `{cc}` (a C compiler is needed for this check): {e}"));
    assert!(
        out.status.success(),
        "`{cc}` failed on the layout program for <{header}>:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the layout program");
    let values: HashMap<String, i64> = String::from_utf8(run.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| {
            let (v, k) = l.split_once(' ').expect("value key");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect();
    assert_eq!(values.len(), keys.len(), "every key printed once");
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_c_expressions() {
        assert_eq!(c_expr("sizeof struct s"), "sizeof(struct s)");
        assert_eq!(c_expr("offsetof struct s.a.b"), "offsetof(struct s, a.b)");
        assert_eq!(c_expr("const X"), "X");
    }

    #[test]
    fn values_come_from_the_header() {
        let v = c_values(
            Path::new("/usr/include"),
            "stdint.h",
            &["sizeof uint32_t", "const INT8_MAX"],
            |_| None,
        );
        assert_eq!((v["sizeof uint32_t"], v["const INT8_MAX"]), (4, 127));
    }
}
