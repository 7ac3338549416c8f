//! Input fields carried to each line of a generate job's `generations.jsonl`
//! (`--keep-columns title,text=article`): which field of the record, under which name, and
//! the refusals of names a line cannot take.

use serde_json::Value;

use super::evaluation_counts::InOrder;
use crate::records::Kept;

/// An input field carried to each output line: the record's `field` (a name, or a path
/// into its objects and lists as a prompt's `{field}`s are) under `name`, as it is in the
/// input (text, number, list or object; null where the record has none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptColumn {
    /// The record's field or path.
    pub field: String,
    /// The line's key.
    pub name: String,
}

impl KeptColumn {
    /// `FIELD` (kept under its own name) or `FIELD=NAME` (`text=article`: the record's
    /// text beside the completion, which is the line's `text`). Spaces around either are
    /// dropped.
    pub fn parse(given: &str) -> Result<Self, String> {
        let (field, name) = match given.split_once('=') {
            Some((field, name)) => (field.trim(), name.trim()),
            None => (given.trim(), given.trim()),
        };
        if field.is_empty() || name.is_empty() {
            return Err(format!(
                "--keep-columns {given:?}: give a field (`title`), a path (`meta.url`) or a \
                 field and the name to write it under (`text=article`)"
            ));
        }
        Ok(Self {
            field: field.to_owned(),
            name: name.to_owned(),
        })
    }

    /// As `--keep-columns` spells it.
    pub fn describe(&self) -> String {
        if self.field == self.name {
            self.field.clone()
        } else {
            format!("{}={}", self.field, self.name)
        }
    }
}

/// Refuses columns no line can hold as asked: a name twice, or a name the line already
/// has for itself (`taken`: the completion's `text`, `id`, the answer checks' fields...).
pub fn check_kept_columns(columns: &[KeptColumn], taken: &[&str]) -> Result<(), String> {
    for (i, column) in columns.iter().enumerate() {
        if columns[..i]
            .iter()
            .any(|earlier| earlier.name == column.name)
        {
            return Err(format!(
                "--keep-columns writes `{}` twice: give each kept field its own name \
                 (FIELD=NAME)",
                column.name
            ));
        }
        if taken.contains(&column.name.as_str()) {
            let renamed = match column.name.as_str() {
                "text" => format!("{}=article", column.field),
                name => format!("{}=input_{name}", column.field),
            };
            return Err(format!(
                "--keep-columns cannot write `{}`: each line has its own `{}` ({}); keep \
                 the field under another name, e.g. --keep-columns {renamed}",
                column.name,
                column.name,
                line_field_meaning(&column.name)
            ));
        }
    }
    Ok(())
}

/// What a line's own field holds, for a refusal.
fn line_field_meaning(name: &str) -> &'static str {
    match name {
        "id" => "the record's id, always written; see --id-field",
        "text" => "the completion",
        _ => "written by the job itself",
    }
}

/// The columns' names, in order (a Parquet output's kept columns).
pub(super) fn kept_names(columns: &[KeptColumn]) -> Vec<&str> {
    columns.iter().map(|c| c.name.as_str()).collect()
}

/// The kept columns of one record, by name in the job's order, from what the reader
/// carried (`carried`: by field); `None` when the job keeps none.
pub(super) fn kept_line_fields<'a>(
    columns: &'a [KeptColumn],
    carried: Option<&'a Kept>,
) -> Option<InOrder<&'a str, &'a Value>> {
    static NULL: Value = Value::Null;
    if columns.is_empty() {
        return None;
    }
    let fields = columns.iter().map(|column| {
        let value = carried.and_then(|kept| kept.get(&column.field));
        (column.name.as_str(), value.unwrap_or(&NULL))
    });
    Some(fields.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_is_kept_under_its_own_name_or_the_one_given() {
        let title = KeptColumn::parse(" title ").unwrap();
        assert_eq!(
            (title.field.as_str(), title.name.as_str()),
            ("title", "title")
        );
        assert_eq!(title.describe(), "title");
        let article = KeptColumn::parse("text = article").unwrap();
        assert_eq!(
            (article.field.as_str(), article.name.as_str()),
            ("text", "article")
        );
        assert_eq!(article.describe(), "text=article");
        let url = KeptColumn::parse("meta.url=url").unwrap();
        assert_eq!(url.field, "meta.url");
        for bad in ["", "=article", "text=", " = "] {
            let refused = KeptColumn::parse(bad).unwrap_err();
            assert!(refused.contains("text=article"), "{refused}");
        }
    }

    #[test]
    fn names_twice_or_taken_by_the_line_are_refused_with_a_name_to_use() {
        let columns = |given: &[&str]| -> Vec<KeptColumn> {
            given
                .iter()
                .map(|c| KeptColumn::parse(c).unwrap())
                .collect()
        };
        let taken = ["id", "text", "correct"];
        assert!(check_kept_columns(&columns(&["title", "text=article"]), &taken).is_ok());
        let text = check_kept_columns(&columns(&["text"]), &taken).unwrap_err();
        assert!(text.contains("its own `text` (the completion)"), "{text}");
        assert!(text.contains("--keep-columns text=article"), "{text}");
        let id = check_kept_columns(&columns(&["uid=id"]), &taken).unwrap_err();
        assert!(id.contains("see --id-field"), "{id}");
        let correct = check_kept_columns(&columns(&["correct"]), &taken).unwrap_err();
        assert!(correct.contains("correct=input_correct"), "{correct}");
        let twice = check_kept_columns(&columns(&["title", "name=title"]), &taken).unwrap_err();
        assert!(twice.contains("`title` twice"), "{twice}");
    }

    #[test]
    fn a_line_gets_each_column_by_name_in_order_and_null_where_the_record_lacks_it() {
        let columns = vec![
            KeptColumn::parse("year").unwrap(),
            KeptColumn::parse("text=article").unwrap(),
            KeptColumn::parse("meta").unwrap(),
        ];
        let mut carried = Kept::new();
        carried.insert("text".into(), Value::from("The article."));
        carried.insert("year".into(), Value::from(1999));
        carried.insert("highlights".into(), Value::from("carried for the answers"));
        let line = kept_line_fields(&columns, Some(&carried)).unwrap();
        assert_eq!(
            serde_json::to_string(&line).unwrap(),
            r#"{"year":1999,"article":"The article.","meta":null}"#
        );
        assert_eq!(kept_line_fields(&[], Some(&carried)), None);
        let none = kept_line_fields(&columns[..1], None).unwrap();
        assert_eq!(none.get("year"), Some(&&Value::Null));
    }
}
