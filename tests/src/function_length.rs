//! How long each function of a source file is, for the house rule that no non-test
//! function runs past 80 lines except a dispatch match (issue 46): a function is read from
//! its `fn` to the brace that closes its body, comments and blank lines included.

use crate::module_graph::{code_only, without_test_items};

/// A function longer than the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LongFunction {
    /// Its name.
    pub name: String,
    /// The line of its `fn`, from 1.
    pub line: usize,
    /// Its length in lines, from its `fn` to its closing brace.
    pub lines: usize,
}

/// The functions of `source` (test items left out) longer than `limit` lines, in order,
/// except dispatch matches: a body that is one `match` (after any `use` lines), one arm
/// per case, is as long as its cases.
pub fn long_functions(source: &str, limit: usize) -> Vec<LongFunction> {
    let code = without_test_items(&code_only(source));
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = next_fn(&code, from) {
        from = at + 2;
        let name: String = code[at + 2..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = body_start(bytes, at + 2) else {
            continue;
        };
        let Some(close) = matching_brace(bytes, open) else {
            continue;
        };
        let line = line_of(&code, at);
        let lines = line_of(&code, close) - line + 1;
        if lines > limit && !is_dispatch_match(&code[open + 1..close]) {
            found.push(LongFunction { name, line, lines });
        }
    }
    found
}

/// Where the next `fn` keyword is, at or after `from`.
fn next_fn(code: &str, from: usize) -> Option<usize> {
    let bytes = code.as_bytes();
    let mut search = from;
    while let Some(offset) = code.get(search..)?.find("fn") {
        let at = search + offset;
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + 2).copied();
        let word_start = before.is_none_or(|b| !(b.is_ascii_alphanumeric() || b == b'_'));
        let word_end = after.is_some_and(|b| b.is_ascii_whitespace());
        if word_start && word_end {
            return Some(at);
        }
        search = at + 2;
    }
    None
}

/// The `{` that opens the body of the function whose signature starts at `from`; `None`
/// for a declaration without one (`fn f();` in a trait, a `fn` pointer type).
fn body_start(bytes: &[u8], from: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (index, &b) in bytes.iter().enumerate().skip(from) {
        match b {
            b'(' | b'[' | b'<' => depth += 1,
            b')' | b']' => depth -= 1,
            // `->` is not a closing angle bracket.
            b'>' if index > 0 && bytes[index - 1] != b'-' => depth -= 1,
            b';' if depth <= 0 => return None,
            b'{' if depth <= 0 => return Some(index),
            _ => {}
        }
    }
    None
}

fn matching_brace(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (index, &b) in bytes.iter().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(index);
                }
            }
            _ => {}
        }
    }
    None
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].bytes().filter(|b| *b == b'\n').count() + 1
}

/// Whether `body` is a single `match` expression, after any `use` declarations.
fn is_dispatch_match(body: &str) -> bool {
    let mut rest = body.trim_start();
    while rest.starts_with("use ") {
        match rest.find(';') {
            Some(end) => rest = rest[end + 1..].trim_start(),
            None => return false,
        }
    }
    let Some(after) = rest.strip_prefix("match ") else {
        return false;
    };
    let Some(open) = after.find('{') else {
        return false;
    };
    matching_brace(after.as_bytes(), open)
        .is_some_and(|close| after[close + 1..].trim().trim_end_matches(';').is_empty())
}
