//! Just enough of Rust's lexical structure for the tidy checks: a crate's files and their
//! module paths, code with comments and string contents blanked (lines kept), inline test
//! modules left out, and the `crate::`/`super::`/`self::` paths the code names.

use std::path::{Path, PathBuf};

/// One source file of a crate.
pub struct CodeFile {
    /// Its module path (`[]` for the crate root).
    pub module: Vec<String>,
    /// A test file (`tests.rs`, `*_tests.rs`, or under a `tests` folder).
    pub is_test: bool,
    /// Its path as shown in a failure: relative to the workspace (`worker/src/link/mod.rs`).
    pub shown: String,
    /// The code with comments, string and char contents blanked and inline `#[cfg(test)]`
    /// modules removed; line breaks kept so that line numbers hold.
    code: String,
}

/// Every `.rs` file under a crate's `src/` (not `src/bin/`; `main.rs` only when there is no
/// `lib.rs`, since a binary beside a library is a crate of its own).
pub fn crate_files(src: &Path) -> Vec<CodeFile> {
    source_files(src, false)
}

/// Every `.rs` file under a crate's `src/`, its binaries' (`src/bin/`, `main.rs`) too: what a
/// check of each function, rather than of the module tree, reads.
pub fn all_source_files(src: &Path) -> Vec<CodeFile> {
    source_files(src, true)
}

fn source_files(src: &Path, with_binaries: bool) -> Vec<CodeFile> {
    let shown_root = src
        .parent()
        .and_then(Path::parent)
        .unwrap_or(src)
        .to_path_buf();
    let has_lib = src.join("lib.rs").exists();
    let mut paths = Vec::new();
    walk(src, &mut paths);
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        let relative = path.strip_prefix(src).expect("under src");
        let parts: Vec<String> = relative
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let binary = parts.first().is_some_and(|p| p == "bin") || (has_lib && parts == ["main.rs"]);
        if binary && !with_binaries {
            continue;
        }
        let module = module_path(&parts);
        let is_test = module.iter().any(|m| m == "tests" || m.ends_with("_tests"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        files.push(CodeFile {
            module,
            is_test,
            shown: path
                .strip_prefix(&shown_root)
                .unwrap_or(&path)
                .display()
                .to_string(),
            code: without_test_modules(&blank_comments_and_strings(&text)),
        });
    }
    files
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `a/b.rs` → `a::b`, `a/mod.rs` → `a`, `lib.rs`/`main.rs` → the root.
fn module_path(parts: &[String]) -> Vec<String> {
    let mut module: Vec<String> = parts.to_vec();
    let last = module.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    let at_root = module.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !at_root {
        module.push(stem.to_string());
    }
    module
}

impl CodeFile {
    /// Every function with a body: its name, first line (1-based) and length in lines, from
    /// its `fn` line to its closing brace.
    pub fn functions(&self) -> Vec<(String, usize, usize)> {
        let lines: Vec<&str> = self.code.lines().collect();
        let mut found = Vec::new();
        for (k, line) in lines.iter().enumerate() {
            let Some(name) = fn_name(line) else {
                continue;
            };
            let mut depth = 0i64;
            let mut started = false;
            for (j, body_line) in lines.iter().enumerate().skip(k) {
                let opens = body_line.matches('{').count() as i64;
                let closes = body_line.matches('}').count() as i64;
                if !started && opens == 0 && body_line.contains(';') {
                    break; // a declaration without a body
                }
                depth += opens - closes;
                started |= opens > 0;
                if started && depth <= 0 {
                    found.push((name.clone(), k + 1, j - k + 1));
                    break;
                }
            }
        }
        found
    }

    /// The 1-based line of the first occurrence of `needle` in code, if any.
    pub fn code_line_with(&self, needle: &str) -> Option<usize> {
        self.code
            .lines()
            .position(|l| {
                l.match_indices(needle)
                    .any(|(at, _)| !ident_char_before(l, at))
            })
            .map(|i| i + 1)
    }

    /// Every module-relative path the code names (`crate::a::b::C`, `super::x`, `self::y`),
    /// resolved to a path from the crate root, with the text that named it.
    pub fn references(&self) -> Vec<(Vec<String>, String)> {
        let mut found = Vec::new();
        let bytes = self.code.as_bytes();
        let mut at = 0;
        while at < bytes.len() {
            let rest = &self.code[at..];
            let base = if rest.starts_with("crate::") {
                Some(Vec::new())
            } else if rest.starts_with("super::") || rest.starts_with("self::") {
                Some(self.module.clone())
            } else {
                None
            };
            match base {
                Some(base) if !path_char_before(&self.code, at) => {
                    let mut parser = TreeParser {
                        text: bytes,
                        at,
                        base_is_crate: rest.starts_with("crate::"),
                    };
                    let start = at;
                    let paths = parser.tree(base);
                    let text: String = self.code[start..parser.at.max(start + 1)]
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ");
                    let text: String = text.chars().take(80).collect();
                    found.extend(paths.into_iter().map(|p| (p, text.clone())));
                    at = parser.at.max(start + 1);
                }
                _ => at += rest.chars().next().map_or(1, char::len_utf8),
            }
        }
        found
    }
}

/// The name of the function a line declares (`pub(crate) async fn name`), if it does.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        rest = after.trim_start();
        if rest.starts_with('(') {
            rest = rest[rest.find(')')? + 1..].trim_start();
        }
    }
    for qualifier in ["const ", "async ", "unsafe ", "extern "] {
        if let Some(after) = rest.strip_prefix(qualifier) {
            rest = after.trim_start();
            if qualifier == "extern " && rest.starts_with('"') {
                rest = rest[1..]
                    .trim_start_matches(|c| c != '"')
                    .get(1..)?
                    .trim_start();
            }
        }
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

fn ident_char_before(text: &str, at: usize) -> bool {
    text[..at]
        .chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// Whether the path at `at` continues another (`a::crate::`, `$crate::`, `ident`).
fn path_char_before(text: &str, at: usize) -> bool {
    text[..at]
        .chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':')
}

/// A `use` tree (or a plain path) from a `crate`/`super`/`self` start.
struct TreeParser<'a> {
    text: &'a [u8],
    at: usize,
    base_is_crate: bool,
}

impl TreeParser<'_> {
    fn skip_space(&mut self) {
        while self.at < self.text.len() && self.text[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn ident(&mut self) -> Option<String> {
        let start = self.at;
        while self.at < self.text.len()
            && (self.text[self.at].is_ascii_alphanumeric() || self.text[self.at] == b'_')
        {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.text[start..self.at]).into())
    }

    fn double_colon(&mut self) -> bool {
        self.skip_space();
        if self.text[self.at..].starts_with(b"::") {
            self.at += 2;
            self.skip_space();
            true
        } else {
            false
        }
    }

    /// The paths of the tree starting here, each from the crate root.
    fn tree(&mut self, mut path: Vec<String>) -> Vec<Vec<String>> {
        self.skip_space();
        if self.at < self.text.len() && self.text[self.at] == b'{' {
            return self.group(path);
        }
        let Some(segment) = self.ident() else {
            return vec![path];
        };
        match segment.as_str() {
            "crate" if self.base_is_crate => {
                self.base_is_crate = false;
            }
            "super" => {
                path.pop();
            }
            "self" => {}
            _ => path.push(segment),
        }
        if self.double_colon() {
            self.tree(path)
        } else {
            vec![path]
        }
    }

    fn group(&mut self, path: Vec<String>) -> Vec<Vec<String>> {
        self.at += 1;
        let mut paths = Vec::new();
        loop {
            self.skip_space();
            match self.text.get(self.at) {
                None => break,
                Some(b'}') => {
                    self.at += 1;
                    break;
                }
                Some(b',') => self.at += 1,
                Some(b'*') => {
                    self.at += 1;
                    paths.push(path.clone());
                }
                Some(_) => {
                    let before = self.at;
                    paths.extend(self.tree(path.clone()));
                    self.skip_space();
                    if self.text[self.at..].starts_with(b"as ") {
                        self.at += 3;
                        self.skip_space();
                        self.ident();
                    }
                    if self.at == before {
                        self.at += 1;
                    }
                }
            }
        }
        paths
    }
}

/// The text with `//` and `/* */` comments, and the contents of string and char literals,
/// replaced by spaces (line breaks kept).
pub fn blank_comments_and_strings(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && matches!(next, Some('#') | Some('"')) && !prev_ident(&chars, i) {
            i = raw_string(&chars, i, &mut out);
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c == '\'' && is_char_literal(&chars, i) {
            out.push('\'');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev_ident(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// `'x'`, `'\n'`, `'\u{1F600}'` are char literals; `'a` in `&'a str` is a lifetime.
fn is_char_literal(chars: &[char], i: usize) -> bool {
    match chars.get(i + 1) {
        Some('\\') => true,
        Some(_) => chars.get(i + 2) == Some(&'\''),
        None => false,
    }
}

/// A raw string `r#"…"#` from `i`; returns the index after it (or after `r` when it is not one).
fn raw_string(chars: &[char], i: usize, out: &mut String) -> usize {
    let mut j = i + 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"') {
        out.push('r');
        return i + 1;
    }
    out.push_str(&" ".repeat(j - i));
    out.push('"');
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
            out.push('"');
            out.push_str(&" ".repeat(hashes));
            return j + 1 + hashes;
        }
        out.push(if chars[j] == '\n' { '\n' } else { ' ' });
        j += 1;
    }
    j
}

/// The code without inline `#[cfg(test)] mod name { … }` blocks (blanked, lines kept).
fn without_test_modules(code: &str) -> String {
    let mut out = code.to_string();
    let mut search_from = 0;
    while let Some(found) = out[search_from..].find("#[cfg(test)]") {
        let start = search_from + found;
        let after = &out[start + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_inline_mod = (trimmed.starts_with("mod ") || trimmed.starts_with("pub mod "))
            && trimmed
                .find(['{', ';'])
                .is_some_and(|k| trimmed.as_bytes()[k] == b'{');
        if !is_inline_mod {
            search_from = start + 1;
            continue;
        }
        let open = start
            + "#[cfg(test)]".len()
            + (after.len() - trimmed.len())
            + trimmed.find('{').expect("checked");
        let mut depth = 0;
        let mut end = out.len();
        for (k, b) in out.as_bytes()[open..].iter().enumerate() {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        let blanked: String = out[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..end, &blanked);
        search_from = end;
    }
    out
}
