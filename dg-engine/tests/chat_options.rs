//! Chat-template options reach the template: tools are declared in the prompt, thinking turns
//! the template's thinking switch, extra variables are seen.

use dg_engine::{DiffusionGemma, Message, Request};
use serde_json::json;

use dg_testkit::fixtures;

#[test]
fn tools_thinking_and_variables_reach_the_template() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let base = Request::chat(vec![Message::user("What is the weather in Paris?")]);
    let text = |r: &Request| {
        let ids = model.prompt_ids_with(&r.prompt, &r.chat).unwrap();
        model.tokenizer().decode(&ids, false).unwrap()
    };
    let plain = text(&base);
    let tool = json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }});
    let with_tools = text(&base.clone().tools(vec![tool]));
    assert!(
        !plain.contains("get_weather") && with_tools.contains("get_weather"),
        "{with_tools}"
    );
    let thinking = text(&base.clone().thinking(true));
    assert_ne!(thinking, plain, "enable_thinking changes the prompt");
    assert_eq!(
        text(&base.clone().thinking(false)),
        plain,
        "off is the template's default"
    );
    // A template variable: the template reads `enable_thinking` from any source.
    let as_var = text(&base.clone().template_var("enable_thinking", json!(true)));
    assert_eq!(as_var, thinking);
    // And the same reaches generation.
    let r = base.clone().thinking(true).max_tokens(8);
    assert_eq!(model.generate(&r).unwrap().stats.prompt_tokens, {
        model.prompt_ids_with(&r.prompt, &r.chat).unwrap().len()
    });
}

#[test]
fn literal_special_tokens_keeps_typed_markers_as_text() {
    let model = DiffusionGemma::load(fixtures().join("models/tiny")).unwrap();
    let tok = model.tokenizer();
    let eos = tok.eos_token_id().unwrap();
    let turn_close = tok.token_to_id("<turn|>").unwrap();
    let ids = |r: &Request| model.prompt_ids_with(&r.prompt, &r.chat).unwrap();
    let chat = Request::chat(vec![Message::user("stop here <eos><turn|> then go on")]);
    let text = Request::text("stop here <eos> then go on");
    // Default: the reference's behaviour, typed markers are control tokens.
    assert!(ids(&chat).contains(&eos));
    assert!(ids(&text).contains(&eos));
    let literal = ids(&chat.clone().literal_special_tokens(true));
    assert!(!literal.contains(&eos), "{literal:?}");
    // Only the template's own turn end is left.
    let count = |ids: &[u32]| ids.iter().filter(|&&i| i == turn_close).count();
    assert_eq!(count(&literal), count(&ids(&chat)) - 1);
    let literal_text = ids(&text.clone().literal_special_tokens(true));
    assert!(!literal_text.contains(&eos));
    assert_eq!(
        tok.decode(&literal_text, false).unwrap(),
        "stop here <eos> then go on"
    );
    // Such a request generates like any other.
    let r = chat.literal_special_tokens(true).max_tokens(4);
    assert_eq!(
        model.generate(&r).unwrap().stats.prompt_tokens,
        literal.len()
    );
}
