//! `--prompt TEMPLATE`: the instruction around each record's text. `{text}` (once) is the
//! record's text, `{field}` any other field of the record (`{field:listed}` a list of it,
//! an item a line after its label: the reader writes it), `{{` and `}}` literal braces.
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
    /// One few-shot example written as text (with the delimiter after it): literal, and
    /// marked, so that the actor can leave out the oldest whole when the prompt is too long.
    Example(String),
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

    /// `description` (a prompt's start, without `{text}`), then the few-shot `examples`
    /// as literal text (each with its delimiter after it), then `prompt`'s template: what
    /// parsing the three written one after the other gives, with each example marked
    /// ([`Self::example_bounds`]). Its source is theirs, one after the other, the
    /// examples' braces doubled.
    pub fn with_examples(
        description: &str,
        examples: &[String],
        prompt: &str,
    ) -> Result<Self, String> {
        let literal = examples.concat().replace('{', "{{").replace('}', "}}");
        let source = format!("{description}{literal}{prompt}");
        let (Ok(head), Ok(body)) = (
            Self::parse(&format!("{description}{{text}}")),
            Self::parse(prompt),
        ) else {
            // The description's braces run into the rest (or a part is wrong, which the
            // whole's parse names): the examples stay unmarked.
            return Self::parse(&source);
        };
        // The description's fields, then the prompt's new ones: their order of first use.
        let mut fields = head.fields;
        for name in &body.fields {
            if !fields.contains(name) {
                fields.push(name.clone());
            }
        }
        let index_of = |field: usize| {
            let name = &body.fields[field];
            fields.iter().position(|f| f == name).unwrap_or(field)
        };
        let moved = |segments: Vec<Segment>| -> Vec<Segment> {
            (segments.into_iter())
                .map(|segment| match segment {
                    Segment::Field(field) => Segment::Field(index_of(field)),
                    other => other,
                })
                .collect()
        };
        let mut before = head.before;
        before.extend(examples.iter().cloned().map(Segment::Example));
        before.extend(moved(body.before));
        let after = moved(body.after);
        Ok(Self {
            source,
            before,
            after,
            fields,
        })
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
                .map(|segment| segment.rendered(values))
                .collect::<String>()
        };
        (render(&self.before), render(&self.after))
    }

    /// Where the few-shot examples lie in the prompt before the record's text as
    /// [`Self::around`] renders it with `values`: each one's start, then the last one's end
    /// (byte offsets); empty without examples.
    pub fn example_bounds(&self, values: &[String]) -> Vec<usize> {
        let mut bounds = Vec::new();
        let mut at = 0;
        for segment in &self.before {
            let length = segment.rendered(values).len();
            if let Segment::Example(_) = segment {
                if bounds.is_empty() {
                    bounds.push(at);
                }
                bounds.push(at + length);
            }
            at += length;
        }
        bounds
    }
}

impl Segment {
    /// The text it stands for, with `values` in place of the fields.
    fn rendered<'a>(&'a self, values: &'a [String]) -> &'a str {
        match self {
            Segment::Literal(text) | Segment::Example(text) => text,
            Segment::Field(index) => values.get(*index).map_or("", String::as_str),
        }
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

/// `--description` as the system message, as lm-evaluation-harness's
/// `--apply_chat_template` places it: under the chat template the description still starts
/// every record's prompt (its fields being the prompt's first), and is moved from the
/// rendered start into the system message, after the job's `--system` and the few-shot
/// delimiter.
#[derive(Clone, Debug, PartialEq)]
pub struct DescriptionAsSystem {
    /// The description as a prompt's start (nothing after its `{text}`).
    description: PromptTemplate,
    /// Between the job's system message and the description.
    delimiter: String,
}

impl DescriptionAsSystem {
    /// `description` (checked by [`check_description`]) after a system message and
    /// `delimiter`; `None` for an empty description.
    pub fn new(description: &str, delimiter: &str) -> Result<Option<Self>, String> {
        if description.is_empty() {
            return Ok(None);
        }
        check_description(description)?;
        Ok(Some(Self {
            description: PromptTemplate::parse(&format!("{description}{{text}}"))?,
            delimiter: delimiter.to_owned(),
        }))
    }

    /// A record's system message (`system`, the job's, then the description rendered with
    /// `values`, the record's fields) and `before` (its prompt's start as rendered with the
    /// description first) without the description. An empty description leaves the job's
    /// system message alone.
    pub fn split(
        &self,
        system: Option<&str>,
        values: &[String],
        before: String,
    ) -> (Option<String>, String) {
        let (description, _) = self.description.around(values);
        let Some(rest) = before.strip_prefix(&description) else {
            return (system.map(str::to_owned), before);
        };
        let rest = rest.to_owned();
        match (system, description.is_empty()) {
            (system, true) => (system.map(str::to_owned), rest),
            (None, false) => (Some(description), rest),
            (Some(system), false) => (
                Some(format!("{system}{}{description}", self.delimiter)),
                rest,
            ),
        }
    }
}

/// A field's name (or path), or one with `:listed` after it (`{options:listed}`).
fn valid_field(name: &str) -> bool {
    let name = name.strip_suffix(LISTED).unwrap_or(name);
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// After a field's name in a prompt: the list the field holds, an item a line, each after
/// its label and ". " (MMLU-Pro's options, however many a record has).
pub const LISTED: &str = ":listed";

#[cfg(test)]
mod tests {
    use super::*;

    /// `{field:listed}` is a field (the reader writes the list); another suffix is refused.
    #[test]
    fn a_listed_field_is_a_field_and_other_suffixes_are_refused() {
        let template = PromptTemplate::parse("{text}\n{options:listed}\nAnswer:").unwrap();
        assert_eq!(template.fields(), ["options:listed"]);
        let error = PromptTemplate::parse("{text} {options:lines}").unwrap_err();
        assert!(error.contains("{options:lines"), "{error}");
    }

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

    /// Few-shot examples between a description and the prompt read as the three written
    /// one after the other (the same source, fields and text), and are marked where they
    /// lie once the fields are filled in.
    #[test]
    fn examples_between_description_and_prompt_are_marked_where_they_lie() {
        let examples = ["Q: {x}\nA: 1\n\n".to_owned(), "Q: y\nA: 2\n\n".to_owned()];
        let prompt = "{level} Q: {text}\nA: {subject}";
        let marked = PromptTemplate::with_examples("About {subject}.\n", &examples, prompt);
        let marked = marked.unwrap();
        let written = PromptTemplate::parse(
            "About {subject}.\nQ: {{x}}\nA: 1\n\nQ: y\nA: 2\n\n{level} Q: {text}\nA: {subject}",
        )
        .unwrap();
        assert_eq!(marked.as_str(), written.as_str());
        assert_eq!(marked.fields(), ["subject", "level"]);
        let values = ["maths".to_owned(), "easy".to_owned()];
        assert_eq!(marked.around(&values), written.around(&values));
        let (before, _) = marked.around(&values);
        let bounds = marked.example_bounds(&values);
        assert_eq!(bounds, [13, 26, 37]);
        assert_eq!(&before[bounds[0]..bounds[1]], examples[0]);
        assert_eq!(&before[bounds[1]..bounds[2]], examples[1]);
        assert!(written.example_bounds(&values).is_empty());
        let bare = PromptTemplate::with_examples("", &[], "{text}").unwrap();
        assert!(bare.example_bounds(&[]).is_empty());
    }

    /// Under the chat template a description leaves the prompt's start for the system
    /// message, after the job's system message and the delimiter; an empty one leaves
    /// both alone.
    #[test]
    fn a_description_moves_from_the_prompt_s_start_into_the_system_message() {
        let description = "Questions about {subject}.\n\n";
        let whole = PromptTemplate::parse(&format!("{description}Q: {{text}}\nA:")).unwrap();
        let values = ["maths".to_owned()];
        let (before, _) = whole.around(&values);
        let moved = DescriptionAsSystem::new(description, "\n\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            moved.split(None, &values, before.clone()),
            (Some("Questions about maths.\n\n".into()), "Q: ".into())
        );
        assert_eq!(
            moved.split(Some("Be brief."), &values, before),
            (
                Some("Be brief.\n\nQuestions about maths.\n\n".into()),
                "Q: ".into()
            )
        );
        let blank = DescriptionAsSystem::new("{subject}", "\n\n")
            .unwrap()
            .unwrap();
        let (before, _) = PromptTemplate::parse("{subject}Q: {text}")
            .unwrap()
            .around(&[String::new()]);
        assert_eq!(
            blank.split(Some("Be brief."), &[String::new()], before),
            (Some("Be brief.".into()), "Q: ".into())
        );
        assert_eq!(DescriptionAsSystem::new("", "\n\n"), Ok(None));
        assert!(DescriptionAsSystem::new("{text}", "").is_err());
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
