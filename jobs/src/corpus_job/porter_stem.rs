//! The Porter stemmer as NLTK's `PorterStemmer` runs it in its default mode
//! (`NLTK_EXTENSIONS`), which is what `rouge-score`'s `use_stemmer=True` stems ROUGE's words
//! with (and so Hugging Face's summarisation examples' ROUGE). Pure.
//!
//! Martin Porter's five steps ("An algorithm for suffix stripping", 1980) with NLTK's
//! departures: a table of irregular forms (`skies`, `dying`, `news`...), words of two
//! letters or fewer kept, `-ies`/`-ied` of four letters to `-ie`, other `-ied` to `-i`,
//! `y` to `i` only after a consonant that is not the whole stem, `-bli` for `-abli`, and
//! `-alli`, `-fulli` and `-logi` in step 2. Written here rather than taken from a crate: the
//! crates on crates.io stem as Porter's original or as Snowball's English (Porter2), which
//! stem many words otherwise, and a ROUGE that differs from `rouge-score`'s is worse than
//! none; a fixture of NLTK's own stems (`tests/fixtures/porter_nltk.json`) holds it to NLTK.
//!
//! It reads ASCII lower-case words (what ROUGE's tokenizer gives); a word with anything
//! else is kept as it is.

/// A rule's condition on the stem left once its suffix is taken off.
#[derive(Clone, Copy)]
enum Condition {
    /// Always.
    Always,
    /// The stem's measure is above 0.
    MeasureAbove0,
    /// The stem's measure is above 1.
    MeasureAbove1,
    /// The stem's measure is above 1 and it ends in `s` or `t` (step 4's `-ion`).
    MeasureAbove1EndingST,
}

/// A suffix, what replaces it, and when.
type Rule = (&'static str, &'static str, Condition);

/// NLTK's table of irregular forms: a word and its stem.
const IRREGULAR: [(&str, &str); 16] = [
    ("sky", "sky"),
    ("skies", "sky"),
    ("dying", "die"),
    ("lying", "lie"),
    ("tying", "tie"),
    ("news", "news"),
    ("innings", "inning"),
    ("inning", "inning"),
    ("outings", "outing"),
    ("outing", "outing"),
    ("cannings", "canning"),
    ("canning", "canning"),
    ("howe", "howe"),
    ("proceed", "proceed"),
    ("exceed", "exceed"),
    ("succeed", "succeed"),
];

/// `word`'s stem.
pub fn porter_stem(word: &str) -> String {
    if !word
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return word.to_owned();
    }
    if let Some((_, stem)) = IRREGULAR.iter().find(|(form, _)| *form == word) {
        return (*stem).to_owned();
    }
    if word.len() <= 2 {
        return word.to_owned();
    }
    let mut stem = step1a(word.to_owned());
    stem = step1b(stem);
    stem = step1c(stem);
    stem = step2(stem);
    stem = step3(stem);
    stem = step4(stem);
    stem = step5a(stem);
    step5b(stem)
}

/// Whether each letter of `word` is a consonant: not a vowel, and a `y` only at the start
/// or after a vowel.
fn consonants(word: &str) -> Vec<bool> {
    let mut flags: Vec<bool> = Vec::with_capacity(word.len());
    for (i, letter) in word.bytes().enumerate() {
        let consonant = match letter {
            b'a' | b'e' | b'i' | b'o' | b'u' => false,
            b'y' => i == 0 || !flags[i - 1],
            _ => true,
        };
        flags.push(consonant);
    }
    flags
}

/// Porter's measure m: how many vowel-consonant changes `stem` has.
fn measure(stem: &str) -> usize {
    let flags = consonants(stem);
    flags.windows(2).filter(|pair| !pair[0] && pair[1]).count()
}

fn contains_vowel(stem: &str) -> bool {
    consonants(stem).contains(&false)
}

/// Condition *d: the word ends in a double consonant.
fn ends_double_consonant(word: &str) -> bool {
    let bytes = word.as_bytes();
    bytes.len() >= 2
        && bytes[bytes.len() - 1] == bytes[bytes.len() - 2]
        && consonants(word)[bytes.len() - 1]
}

/// Condition *o: the word ends consonant-vowel-consonant, the last not `w`, `x` or `y`; or
/// (NLTK's) is two letters, a vowel and a consonant.
fn ends_cvc(word: &str) -> bool {
    let (bytes, flags) = (word.as_bytes(), consonants(word));
    let n = bytes.len();
    (n >= 3
        && flags[n - 3]
        && !flags[n - 2]
        && flags[n - 1]
        && !matches!(bytes[n - 1], b'w' | b'x' | b'y'))
        || (n == 2 && !flags[0] && flags[1])
}

fn holds(condition: Condition, stem: &str) -> bool {
    match condition {
        Condition::Always => true,
        Condition::MeasureAbove0 => measure(stem) > 0,
        Condition::MeasureAbove1 => measure(stem) > 1,
        Condition::MeasureAbove1EndingST => {
            measure(stem) > 1 && matches!(stem.as_bytes().last(), Some(b's' | b't'))
        }
    }
}

/// The first rule whose suffix `word` has decides: its replacement where its condition
/// holds, else the word as it is (no later rule is tried).
fn first_rule(word: String, rules: &[Rule]) -> String {
    for &(suffix, replacement, condition) in rules {
        if let Some(stem) = word.strip_suffix(suffix) {
            return match holds(condition, stem) {
                true => format!("{stem}{replacement}"),
                false => word,
            };
        }
    }
    word
}

fn step1a(word: String) -> String {
    if word.len() == 4 && word.ends_with("ies") {
        return format!("{}ie", &word[..1]);
    }
    use Condition::Always;
    first_rule(
        word,
        &[
            ("sses", "ss", Always),
            ("ies", "i", Always),
            ("ss", "ss", Always),
            ("s", "", Always),
        ],
    )
}

fn step1b(word: String) -> String {
    if let Some(stem) = word.strip_suffix("ied") {
        return match word.len() {
            4 => format!("{stem}ie"),
            _ => format!("{stem}i"),
        };
    }
    if let Some(stem) = word.strip_suffix("eed") {
        return match measure(stem) > 0 {
            true => format!("{stem}ee"),
            false => word,
        };
    }
    let Some(stem) = (["ed", "ing"].iter())
        .filter_map(|suffix| word.strip_suffix(suffix))
        .find(|stem| contains_vowel(stem))
    else {
        return word;
    };
    for (ending, restored) in [("at", "ate"), ("bl", "ble"), ("iz", "ize")] {
        if let Some(root) = stem.strip_suffix(ending) {
            return format!("{root}{restored}");
        }
    }
    if ends_double_consonant(stem) {
        return match stem.as_bytes()[stem.len() - 1] {
            b'l' | b's' | b'z' => stem.to_owned(),
            _ => stem[..stem.len() - 1].to_owned(),
        };
    }
    match measure(stem) == 1 && ends_cvc(stem) {
        true => format!("{stem}e"),
        false => stem.to_owned(),
    }
}

fn step1c(word: String) -> String {
    match word.strip_suffix('y') {
        Some(stem) if stem.len() > 1 && consonants(stem)[stem.len() - 1] => format!("{stem}i"),
        _ => word,
    }
}

fn step2(word: String) -> String {
    use Condition::MeasureAbove0 as M0;
    if let Some(stem) = word.strip_suffix("alli")
        && measure(stem) > 0
    {
        return step2(format!("{stem}al"));
    }
    // `-logi` asks the measure of the word without `ogi`, not of its stem.
    if let Some(stem) = word.strip_suffix("logi") {
        return match measure(&word[..word.len() - 3]) > 0 {
            true => format!("{stem}log"),
            false => word,
        };
    }
    first_rule(
        word,
        &[
            ("ational", "ate", M0),
            ("tional", "tion", M0),
            ("enci", "ence", M0),
            ("anci", "ance", M0),
            ("izer", "ize", M0),
            ("bli", "ble", M0),
            ("alli", "al", M0),
            ("entli", "ent", M0),
            ("eli", "e", M0),
            ("ousli", "ous", M0),
            ("ization", "ize", M0),
            ("ation", "ate", M0),
            ("ator", "ate", M0),
            ("alism", "al", M0),
            ("iveness", "ive", M0),
            ("fulness", "ful", M0),
            ("ousness", "ous", M0),
            ("aliti", "al", M0),
            ("iviti", "ive", M0),
            ("biliti", "ble", M0),
            ("fulli", "ful", M0),
        ],
    )
}

fn step3(word: String) -> String {
    use Condition::MeasureAbove0 as M0;
    first_rule(
        word,
        &[
            ("icate", "ic", M0),
            ("ative", "", M0),
            ("alize", "al", M0),
            ("iciti", "ic", M0),
            ("ical", "ic", M0),
            ("ful", "", M0),
            ("ness", "", M0),
        ],
    )
}

fn step4(word: String) -> String {
    use Condition::{MeasureAbove1 as M1, MeasureAbove1EndingST};
    first_rule(
        word,
        &[
            ("al", "", M1),
            ("ance", "", M1),
            ("ence", "", M1),
            ("er", "", M1),
            ("ic", "", M1),
            ("able", "", M1),
            ("ible", "", M1),
            ("ant", "", M1),
            ("ement", "", M1),
            ("ment", "", M1),
            ("ent", "", M1),
            ("ion", "", MeasureAbove1EndingST),
            ("ou", "", M1),
            ("ism", "", M1),
            ("ate", "", M1),
            ("iti", "", M1),
            ("ous", "", M1),
            ("ive", "", M1),
            ("ize", "", M1),
        ],
    )
}

fn step5a(word: String) -> String {
    match word.strip_suffix('e') {
        Some(stem) if measure(stem) > 1 || (measure(stem) == 1 && !ends_cvc(stem)) => {
            stem.to_owned()
        }
        _ => word,
    }
}

fn step5b(word: String) -> String {
    match word.strip_suffix('l') {
        Some(stem) if word.ends_with("ll") && measure(stem) > 1 => stem.to_owned(),
        _ => word,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of Porter's paper, NLTK's irregular forms and its departures.
    #[test]
    fn the_paper_s_examples_and_nltk_s_departures_stem_as_nltk_does() {
        for (word, stem) in [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "tie"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("conflated", "conflat"),
            ("hopping", "hop"),
            ("falling", "fall"),
            ("filing", "file"),
            ("happy", "happi"),
            ("enjoy", "enjoy"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("generalization", "gener"),
            ("hopefulness", "hope"),
            ("triplicate", "triplic"),
            ("adoption", "adopt"),
            ("controll", "control"),
            ("skies", "sky"),
            ("dying", "die"),
            ("news", "news"),
            ("died", "die"),
            ("spied", "spi"),
            ("is", "is"),
            ("analogi", "analog"),
            ("radicalli", "radic"),
            ("yyyy", "yyyi"),
            ("1990s", "1990"),
            ("naïve", "naïve"),
        ] {
            assert_eq!(porter_stem(word), stem, "{word}");
        }
    }

    /// Every stem of NLTK's in the fixture (`scripts/make-porter-fixture.py`: Wikipedia's
    /// frequent words and those with each suffix the rules name), ours too.
    #[test]
    fn nltk_s_stems_of_wikipedia_s_words_are_ours() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/porter_nltk.json"
        );
        let fixture: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(fixture["mode"], "NLTK_EXTENSIONS");
        let stems = fixture["stems"].as_object().unwrap();
        assert!(stems.len() > 3000, "{}", stems.len());
        let differ: Vec<String> = (stems.iter())
            .filter(|(word, stem)| porter_stem(word) != stem.as_str().unwrap())
            .map(|(word, stem)| format!("{word}: NLTK {stem}, ours {}", porter_stem(word)))
            .collect();
        assert!(differ.is_empty(), "{} differ: {differ:#?}", differ.len());
    }
}
