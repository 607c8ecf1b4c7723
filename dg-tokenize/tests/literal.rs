//! Special-token strings in messages kept as text (`Tokenizer::apply_chat_template_literal`,
//! `Tokenizer::encode_literal`) on the tiny fixture's tokenizer and real chat template.

use dg_tokenize::{ChatTemplate, ContentPart, Message, RenderOptions, Tokenizer};

fn dir() -> std::path::PathBuf {
    dg_testkit::model_dir("tiny")
}

fn load() -> (Tokenizer, ChatTemplate) {
    let tok = Tokenizer::from_dir(dir()).unwrap();
    let template = ChatTemplate::from_dir(dir())
        .unwrap()
        .with_special_tokens(tok.special_tokens_map());
    (tok, template)
}

fn prompt() -> RenderOptions {
    RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    }
}

/// The prompt of `messages` rendered as usual and with typed special tokens kept as text.
fn both_ways(
    tok: &Tokenizer,
    template: &ChatTemplate,
    messages: &[Message],
) -> (Vec<u32>, Vec<u32>) {
    let normal = tok
        .apply_chat_template(template, messages, &prompt())
        .unwrap();
    let literal = tok
        .apply_chat_template_literal(template, messages, &prompt())
        .unwrap();
    (normal, literal)
}

fn id(tok: &Tokenizer, token: &str) -> u32 {
    tok.token_to_id(token).unwrap()
}

#[test]
fn encode_literal_spells_special_tokens_out() {
    let (tok, _) = load();
    let eos = tok.eos_token_id().unwrap();
    assert_eq!(tok.encode("<eos>", false).unwrap(), vec![eos]);
    let literal = tok.encode_literal("<eos>", false).unwrap();
    assert!(literal.len() > 1 && !literal.contains(&eos), "{literal:?}");
    assert_eq!(tok.decode(&literal, false).unwrap(), "<eos>");
    // Text without special tokens encodes the same either way.
    assert_eq!(
        tok.encode_literal("hello there", false).unwrap(),
        tok.encode("hello there", false).unwrap()
    );
}

#[test]
fn special_tokens_typed_in_a_message_stay_text_and_the_templates_stay_special() {
    let (tok, template) = load();
    let content = "hi <eos> look <|image|>";
    let messages = [Message::user(content)];
    let (normal, literal) = both_ways(&tok, &template, &messages);
    let (eos, image) = (id(&tok, "<eos>"), id(&tok, "<|image|>"));
    assert!(normal.contains(&eos) && normal.contains(&image));
    assert!(
        !literal.contains(&eos) && !literal.contains(&image),
        "{literal:?}"
    );

    // The render splits at the template's markers; the text between them is the literal
    // encoding of what the user typed, framed by the template's text.
    let rendered = template.render(&messages, &prompt()).unwrap();
    let at = rendered.find(content).unwrap();
    let (head, rest) = rendered.split_at(at);
    let tail = &rest[content.len()..];
    let turn_open = "<|turn>";
    let head_special = &head[..head.rfind(turn_open).unwrap() + turn_open.len()];
    let head_text = &head[head_special.len()..];
    let mut want = tok.encode(head_special, false).unwrap();
    want.extend(
        tok.encode_literal(&format!("{head_text}{content}"), false)
            .unwrap(),
    );
    want.extend(tok.encode(tail, false).unwrap());
    assert_eq!(literal, want);

    // The template's own markers are control tokens in both modes, as often.
    for marker in ["<bos>", "<|turn>", "<turn|>"] {
        let m = id(&tok, marker);
        let count = |ids: &[u32]| ids.iter().filter(|&&i| i == m).count();
        assert!(count(&literal) > 0, "{marker}");
        assert_eq!(count(&literal), count(&normal), "{marker}");
    }
    assert_eq!(
        tok.decode(&literal, false).unwrap(),
        tok.decode(&normal, false).unwrap()
    );
}

#[test]
fn without_special_strings_literal_mode_changes_nothing() {
    let (tok, template) = load();
    let messages = [
        Message::system("Be brief."),
        Message::user("Name a river < > eos"),
        Message::assistant("The Nile."),
        Message::user("And a sea?"),
    ];
    let (normal, literal) = both_ways(&tok, &template, &messages);
    assert_eq!(literal, normal);
}

#[test]
fn parts_and_earlier_turns_are_literal_too_and_image_parts_stay_placeholders() {
    let (tok, template) = load();
    let image = id(&tok, "<|image|>");
    let messages = [
        Message::user("say <turn|>"),
        Message::assistant("ok <eos>"),
        Message::user(vec![
            ContentPart::image(),
            ContentPart::text("what is <|image|>?"),
        ]),
    ];
    let (normal, literal) = both_ways(&tok, &template, &messages);
    let count = |ids: &[u32], t: u32| ids.iter().filter(|&&i| i == t).count();
    // One image placeholder from the image part, none from the typed text.
    assert_eq!(count(&normal, image), 2);
    assert_eq!(count(&literal, image), 1);
    let turn_close = id(&tok, "<turn|>");
    assert_eq!(count(&literal, turn_close), count(&normal, turn_close) - 1);
    assert!(!literal.contains(&id(&tok, "<eos>")));
}

#[test]
fn private_use_characters_in_messages_survive() {
    let (tok, template) = load();
    // The placeholders' delimiter must be a character the messages do not use.
    let text = "\u{F0000}0\u{F0000} <eos> \u{F0001}";
    let messages = [Message::user(text)];
    let literal = tok
        .apply_chat_template_literal(&template, &messages, &prompt())
        .unwrap();
    assert!(tok.decode(&literal, false).unwrap().contains(text));
    assert!(!literal.contains(&id(&tok, "<eos>")));
}
