//! One line of a JSONL corpus as a record, or the reason it is skipped. The embed job's
//! reader and the sweep's data share these reasons, so a bad line reads the same in both.

use serde_json::{Map, Value};

/// A record's carried fields (`--keep-columns`), by name.
pub type Kept = Map<String, Value>;

/// Where `path` leads inside `value`: each step (between dots) a key of an object or an
/// index from 0 of a list (`text.2`, `source`); `None` where a step finds nothing.
pub fn value_at_path<'a>(mut value: &'a Value, path: &str) -> Option<&'a Value> {
    for step in path.split('.') {
        value = match value {
            Value::Object(map) => map.get(step)?,
            Value::Array(list) => list.get(step.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(value)
}

/// The line as text, or "invalid UTF-8".
pub fn line_text(bytes: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(bytes).map_err(|_| "invalid UTF-8".to_owned())
}

/// Whether a line holds no record (empty or only whitespace).
pub fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace)
}

/// The line's JSON object, or "malformed JSON: ..." / "not a JSON object".
pub fn json_object(text: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(format!("malformed JSON: {e}")),
    }
}

/// Splits a file's bytes into lines numbered from 1, without their `\n` or `\r\n`.
pub fn numbered_lines(bytes: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes
        .split(|b| *b == b'\n')
        .filter(move |_| !bytes.is_empty())
        .enumerate()
        .map(|(index, line)| (index as u64 + 1, line.strip_suffix(b"\r").unwrap_or(line)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bad_line_has_its_reason() {
        assert_eq!(line_text(&[0xff, 0xfe]).unwrap_err(), "invalid UTF-8");
        assert!(
            json_object("{\"a\":")
                .unwrap_err()
                .starts_with("malformed JSON: ")
        );
        assert_eq!(json_object("[1, 2]").unwrap_err(), "not a JSON object");
        assert_eq!(json_object("{\"text\": \"x\"}").unwrap()["text"], "x");
        assert!(is_blank(b"  \t") && !is_blank(b" a"));
    }

    #[test]
    fn lines_are_numbered_from_one_without_line_ends() {
        let lines: Vec<_> = numbered_lines(b"a\r\n\nb\n").collect();
        assert_eq!(lines, vec![(1, &b"a"[..]), (2, &b""[..]), (3, &b"b"[..])]);
        assert_eq!(numbered_lines(b"").count(), 0);
        assert_eq!(numbered_lines(b"last").count(), 1);
    }
}
