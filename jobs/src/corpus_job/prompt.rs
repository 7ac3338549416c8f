//! `--prompt TEMPLATE`: the instruction around each record's text. `{text}` (once) is the
//! record's text, `{field}` any other field of the record, `{{` and `}}` literal braces.
//! The text stays apart from the rest, so the actor can cut it (and never the instruction)
//! to fit the model's context.

/// A parsed `--prompt`.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptTemplate {
    /// As given.
    source: String,
    before: Vec<Segment>,
    after: Vec<Segment>,
    /// The fields named besides `text`, each once, in order of first use.
    fields: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
enum Segment {
    Literal(String),
    /// An index into `fields`.
    Field(usize),
}

impl PromptTemplate {
    /// Parses `template`; the error says what is wrong with it and how to write it.
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut parsed = Self {
            source: template.to_owned(),
            before: Vec::new(),
            after: Vec::new(),
            fields: Vec::new(),
        };
        let mut seen_text = false;
        let mut literal = String::new();
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, chars.peek()) {
                ('{', Some('{')) | ('}', Some('}')) => {
                    chars.next();
                    literal.push(c);
                }
                ('{', _) => {
                    let mut name = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    if !closed || !valid_field(&name) {
                        return Err(format!(
                            "--prompt has `{{{name}` where a field name in braces was expected, \
                             like {{text}} or {{title}}; write {{{{ and }}}} for literal braces"
                        ));
                    }
                    let segments = match seen_text {
                        false => &mut parsed.before,
                        true => &mut parsed.after,
                    };
                    if !literal.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut literal)));
                    }
                    if name == "text" {
                        if seen_text {
                            return Err("--prompt holds {text} twice; name the record's text \
                                        once"
                                .into());
                        }
                        seen_text = true;
                        continue;
                    }
                    let index = match parsed.fields.iter().position(|f| *f == name) {
                        Some(index) => index,
                        None => {
                            parsed.fields.push(name);
                            parsed.fields.len() - 1
                        }
                    };
                    segments.push(Segment::Field(index));
                }
                ('}', _) => {
                    return Err("--prompt has a lone `}`; write }} for a literal brace".into());
                }
                _ => literal.push(c),
            }
        }
        if !seen_text {
            return Err(format!(
                "--prompt must hold {{text}}, where each record's text goes (for example \
                 \"Summarise this article:\\n\\n{{text}}\"); it was {template:?}"
            ));
        }
        if !literal.is_empty() {
            parsed.after.push(Segment::Literal(literal));
        }
        Ok(parsed)
    }

    /// The template as given.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The record fields the template names besides `text`.
    pub fn fields(&self) -> &[String] {
        &self.fields
    }

    /// Whether anything (text or a field) comes before `{text}`: a scored text then has a
    /// context, as a `loglikelihood` request of lm-evaluation-harness has.
    pub fn has_context(&self) -> bool {
        !self.before.is_empty()
    }

    /// The prompt before and after the record's text, with `values` (one per
    /// [`Self::fields`], in order) in place of the fields.
    pub fn around(&self, values: &[String]) -> (String, String) {
        let render = |segments: &[Segment]| {
            segments
                .iter()
                .map(|segment| match segment {
                    Segment::Literal(text) => text.as_str(),
                    Segment::Field(index) => values.get(*index).map_or("", String::as_str),
                })
                .collect::<String>()
        };
        (render(&self.before), render(&self.after))
    }
}

/// Checks `--description` (text before each record's prompt and its few-shot examples,
/// with the record's `{field}`s, lm-evaluation-harness's description): it parses as a
/// prompt's start would, and holds no `{text}`.
pub fn check_description(description: &str) -> Result<(), String> {
    match PromptTemplate::parse(&format!("{description}{{text}}")) {
        Ok(_) => Ok(()),
        Err(error) if error.contains("{text} twice") => Err(
            "--description goes before the few-shot examples and the prompt, so it cannot hold \
             {text}: --prompt places the record's text"
                .into(),
        ),
        Err(error) => Err(error.replace("--prompt", "--description")),
    }
}

fn valid_field(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_splits_the_prompt_and_fields_fill_in_on_either_side() {
        let template =
            PromptTemplate::parse("Title: {title}\n{text}\n\nSummarise {title} in {{one}} line.")
                .unwrap();
        assert_eq!(template.fields(), ["title"]);
        let (before, after) = template.around(&["Rain".into()]);
        assert_eq!(before, "Title: Rain\n");
        assert_eq!(after, "\n\nSummarise Rain in {one} line.");
        let bare = PromptTemplate::parse("{text}").unwrap();
        assert_eq!(bare.around(&[]), (String::new(), String::new()));
    }

    #[test]
    fn a_prompt_without_text_or_with_broken_braces_is_refused_saying_how_to_write_it() {
        let error = PromptTemplate::parse("Summarise this").unwrap_err();
        assert!(error.contains("must hold {text}"), "{error}");
        let error = PromptTemplate::parse("{text} and {text}").unwrap_err();
        assert!(error.contains("twice"), "{error}");
        let error = PromptTemplate::parse("{text} {bad name}").unwrap_err();
        assert!(error.contains("{{ and }}"), "{error}");
        let error = PromptTemplate::parse("{text} }").unwrap_err();
        assert!(error.contains("lone"), "{error}");
        let error = PromptTemplate::parse("{text} {unclosed").unwrap_err();
        assert!(error.contains("field name in braces"), "{error}");
    }

    /// A description parses as a prompt's start; `{text}` in it or a bad brace is refused
    /// naming it.
    #[test]
    fn a_description_holds_fields_and_no_text() {
        assert!(check_description("About {subject}: {{braces}}.\n\n").is_ok());
        assert!(check_description("").is_ok());
        let error = check_description("Read {text} first").unwrap_err();
        assert!(error.contains("--description goes before"), "{error}");
        let error = check_description("About {sub ject}").unwrap_err();
        assert!(
            error.starts_with("--description has `{sub ject`"),
            "{error}"
        );
    }
}
