//! dg-tokenize against the Python reference: tests/fixtures/goldens/tokenize.json, written by
//! tools/reference/dump_tokenize_goldens.py (transformers 5.12.1 + Jinja2 3.1.6 + tokenizers
//! 0.22.2 as mlx-optiq 0.7.7 drives them). Every string must match byte for byte and every id
//! sequence exactly.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use dg_tokenize::{
    expand_image_tokens, ChatTemplate, DecoderKind, ImageTokenIds, Message, RenderOptions,
    TokenizeError, Tokenizer,
};
use serde_json::{Map, Value};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn goldens() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| dg_testkit::load_json("tokenize.json"))
}

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let dir = root().join(goldens()["tokenizer_dir"].as_str().unwrap());
        Tokenizer::from_dir(dir).expect("fixture tokenizer loads")
    })
}

fn template() -> &'static ChatTemplate {
    static C: OnceLock<ChatTemplate> = OnceLock::new();
    C.get_or_init(|| {
        let path = root().join(goldens()["chat_template"].as_str().unwrap());
        ChatTemplate::from_file(path)
            .expect("real chat template compiles")
            .with_special_tokens(tokenizer().special_tokens_map())
    })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn template_file_is_the_one_the_goldens_used() {
    // A changed template must come with regenerated goldens.
    let path = root().join(goldens()["chat_template"].as_str().unwrap());
    let text = std::fs::read(&path).unwrap();
    let want = goldens()["chat_template_sha256"].as_str().unwrap();
    let got = sha256_hex(&text);
    assert_eq!(got, want, "{path:?} changed since the goldens were dumped");
}

#[test]
fn tokenizer_metadata() {
    let g = &goldens()["tokenizer"];
    let tok = tokenizer();
    assert_eq!(tok.vocab_size() as u64, g["vocab_size"].as_u64().unwrap());
    let want_map = g["special_tokens_map"].as_object().unwrap();
    let got_map = tok.special_tokens_map();
    assert_eq!(
        got_map.iter().collect::<Vec<_>>(),
        want_map.iter().collect::<Vec<_>>(),
        "special_tokens_map (values and order)"
    );
    assert_eq!(tok.special_ids(), ids(&g["all_special_ids"]));
    for id in 0..tok.vocab_size() as u32 {
        assert_eq!(
            tok.is_special(id),
            ids(&g["all_special_ids"]).contains(&id),
            "is_special({id})"
        );
    }
    assert_eq!(
        tok.eos_token_id().map(u64::from),
        g["eos_token_id"].as_u64()
    );
    assert_eq!(
        tok.bos_token_id().map(u64::from),
        g["bos_token_id"].as_u64()
    );
    // The reference's stop set: [tokenizer.eos_token_id] + config.eos_token_id.
    let mut want_eos = vec![g["eos_token_id"].as_u64().unwrap() as u32];
    for id in ids(&g["config_eos_token_id"]) {
        if !want_eos.contains(&id) {
            want_eos.push(id);
        }
    }
    assert_eq!(tok.eos_token_ids(&ids(&g["config_eos_token_id"])), want_eos);
    assert_eq!(g["detokenizer"], "SPMStreamingDetokenizer");
    assert_eq!(
        tok.stream_detokenizer().kind(),
        DecoderKind::Spm {
            trim_space: g["detokenizer_trim_space"].as_bool().unwrap()
        }
    );
}

#[test]
fn encode_matches_reference() {
    let tok = tokenizer();
    let cases = goldens()["encode"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&c["ids_special"]),
            "{text:?} (special)"
        );
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids(&c["ids_plain"]),
            "{text:?}"
        );
    }
}

#[test]
fn decode_matches_reference() {
    let tok = tokenizer();
    for c in goldens()["decode"].as_array().unwrap() {
        let i = ids(&c["ids"]);
        assert_eq!(
            tok.decode(&i, false).unwrap(),
            c["text"].as_str().unwrap(),
            "{i:?}"
        );
        assert_eq!(
            tok.decode(&i, true).unwrap(),
            c["text_skip_special"].as_str().unwrap(),
            "{i:?} (skip special)"
        );
    }
}

fn options(c: &Value) -> RenderOptions {
    RenderOptions {
        add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(),
        enable_thinking: c.get("enable_thinking").and_then(Value::as_bool),
        tools: c.get("tools").and_then(Value::as_array).map(|t| t.to_vec()),
        extra: c
            .get("extra")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
    }
}

fn messages(v: &Value) -> Vec<Message> {
    serde_json::from_value(v.clone()).expect("messages deserialize into dg_tokenize::Message")
}

#[test]
fn chat_template_renders_byte_identical() {
    let tok = tokenizer();
    let cases = goldens()["chat"].as_array().unwrap();
    assert!(cases.len() >= 20);
    let mut rendered = 0;
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let msgs = messages(&c["messages"]);
        let opts = options(c);
        let got = template().render(&msgs, &opts);
        if let Some(err) = c.get("error") {
            assert!(
                matches!(got, Err(TokenizeError::Template { .. })),
                "{name}: Jinja2 raised {err}, we got {got:?}"
            );
            continue;
        }
        let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = c["rendered"].as_str().unwrap();
        assert_eq!(got, want, "{name}: rendered text differs");
        assert_eq!(
            tok.encode(&got, false).unwrap(),
            ids(&c["ids"]),
            "{name}: ids"
        );
        assert_eq!(
            tok.apply_chat_template(template(), &msgs, &opts).unwrap(),
            ids(&c["ids"]),
            "{name}: apply_chat_template"
        );
        rendered += 1;
    }
    assert!(rendered >= 20);
}

#[test]
fn checkpoint_dir_template_renders_the_same() {
    // The fixture checkpoint ships the real template; loading it the checkpoint way
    // (chat_template.jinja in the model dir) must give the same prompts.
    let dir = root().join(goldens()["tokenizer_dir"].as_str().unwrap());
    let t = ChatTemplate::from_dir(&dir)
        .unwrap()
        .with_special_tokens(tokenizer().special_tokens_map());
    for c in goldens()["chat"].as_array().unwrap() {
        if let Some(want) = c.get("rendered") {
            let got = t.render(&messages(&c["messages"]), &options(c)).unwrap();
            assert_eq!(got, want.as_str().unwrap(), "{}", c["name"]);
        }
    }
}

#[test]
fn image_prompts_match_reference_splice() {
    let tok = tokenizer();
    let g = &goldens()["tokenizer"]["image_token_ids"];
    let image_ids = ImageTokenIds {
        image: g["image"].as_u64().unwrap() as u32,
        boi: g["boi"].as_u64().unwrap() as u32,
        eoi: g["eoi"].as_u64().unwrap() as u32,
    };
    assert_eq!(tok.special_token_id("image_token"), Some(image_ids.image));
    assert_eq!(tok.special_token_id("boi_token"), Some(image_ids.boi));
    assert_eq!(tok.special_token_id("eoi_token"), Some(image_ids.eoi));
    for c in goldens()["image_prompts"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let counts: Vec<usize> = ids(&c["soft_tokens"]).iter().map(|&n| n as usize).collect();
        // The reference's prompt: one user turn, one <|image|> per image before the text.
        let content = format!(
            "{}{}",
            "<|image|>".repeat(counts.len()),
            c["prompt"].as_str().unwrap()
        );
        let opts = RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        let text = template().render(&[Message::user(content)], &opts).unwrap();
        assert_eq!(text, c["rendered"].as_str().unwrap(), "{name}");
        let raw = tok.encode(&text, false).unwrap();
        assert_eq!(raw, ids(&c["raw_ids"]), "{name}: raw ids");
        let out = expand_image_tokens(&raw, &image_ids, &counts).unwrap();
        assert_eq!(out.ids, ids(&c["ids"]), "{name}: expanded ids");
        assert_eq!(
            out.token_types,
            ids(&c["token_types"]),
            "{name}: token types"
        );
        // Too few and too many counts are both errors.
        let mut more = counts.clone();
        more.push(4);
        assert!(matches!(
            expand_image_tokens(&raw, &image_ids, &more),
            Err(TokenizeError::ImageCountMismatch { .. })
        ));
        assert!(matches!(
            expand_image_tokens(&raw, &image_ids, &counts[1..]),
            Err(TokenizeError::ImageCountMismatch { .. })
        ));
    }
}

#[test]
fn stream_detokenizer_matches_reference() {
    let tok = tokenizer();
    let cases = goldens()["stream"].as_array().unwrap();
    assert!(cases.len() >= 15);
    let mut tails_kept = 0;
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let seq = ids(&c["ids"]);
        let want_segments = c["segments"].as_array().unwrap();
        let mut det = tok.stream_detokenizer();
        let mut emitted = String::new();
        for (i, (&id, want)) in seq.iter().zip(want_segments).enumerate() {
            let got = det.push(id).unwrap().unwrap_or_default();
            assert_eq!(
                got,
                want.as_str().unwrap(),
                "{name}: segment after id #{i} ({id})"
            );
            emitted.push_str(&got);
        }
        let tail = det.flush().unwrap();
        let want_text = c["text"].as_str().unwrap();
        let want_final = c["final_segment"].as_str().unwrap();
        assert_eq!(det.text(), want_text, "{name}: final text");
        assert!(
            want_text.starts_with(&emitted),
            "{name}: emitted text is a prefix"
        );
        if !want_final.is_empty() || !want_text.ends_with('\u{FFFD}') {
            assert_eq!(tail, want_final, "{name}: final segment");
        } else {
            // The reference drops a tail ending in U+FFFD; we return it.
            assert_eq!(tail, &want_text[emitted.len()..], "{name}: kept tail");
            tails_kept += usize::from(!tail.is_empty());
        }
        assert_eq!(format!("{emitted}{tail}"), want_text, "{name}: all text");
        assert_eq!(
            tok.decode(&seq, false).unwrap(),
            c["decode"].as_str().unwrap(),
            "{name}: decode"
        );
    }
    // The goldens include streams whose reference output loses its tail.
    assert!(tails_kept >= 1);
}

#[test]
fn jinja_environment_matches_python() {
    let cases = goldens()["jinja"].as_array().unwrap();
    assert!(cases.len() >= 60);
    let mut failures = Vec::new();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let src = c["template"].as_str().unwrap();
        let ctx: Map<String, Value> = c["context"].as_object().unwrap().clone();
        let opts = RenderOptions {
            extra: ctx,
            ..RenderOptions::default()
        };
        let got = ChatTemplate::new(src).and_then(|t| t.render(&[], &opts));
        match (c.get("error"), got) {
            (Some(_), Err(_)) => {}
            (Some(err), Ok(out)) => {
                failures.push(format!("{name}: Jinja2 raised {err}, we rendered {out:?}"))
            }
            (None, Err(e)) => failures.push(format!("{name}: {e}")),
            (None, Ok(out)) => {
                let want = c["rendered"].as_str().unwrap();
                if out != want {
                    failures.push(format!("{name}:\n  ours:   {out:?}\n  Jinja2: {want:?}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn raise_exception_message_is_kept() {
    let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}").unwrap();
    let err = t.render(&[], &RenderOptions::default()).unwrap_err();
    assert!(err.to_string().contains("roles must alternate"), "{err}");
}

#[test]
fn template_from_dir_and_tokenizer_config_fallbacks() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        ChatTemplate::from_dir(dir.path()),
        Err(TokenizeError::NoChatTemplate { .. })
    ));
    let cfg = dir.path().join("tokenizer_config.json");
    std::fs::write(&cfg, r#"{"chat_template": "A{{ messages[0].content }}"}"#).unwrap();
    let t = ChatTemplate::from_dir(dir.path()).unwrap();
    assert_eq!(
        t.render(&[Message::user("x")], &RenderOptions::default())
            .unwrap(),
        "Ax"
    );
    std::fs::write(
        &cfg,
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_dir(dir.path()).unwrap();
    assert_eq!(t.render(&[], &RenderOptions::default()).unwrap(), "D");
    std::fs::write(dir.path().join("chat_template.jinja"), "J\n").unwrap();
    let t = ChatTemplate::from_dir(dir.path()).unwrap();
    // Jinja2 drops one trailing newline (keep_trailing_newline=False).
    assert_eq!(t.render(&[], &RenderOptions::default()).unwrap(), "J");
    std::fs::write(&cfg, r#"{"chat_template": 3}"#).unwrap();
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    assert!(matches!(
        ChatTemplate::from_dir(dir.path()),
        Err(TokenizeError::Field { .. })
    ));
}

#[test]
fn bad_inputs_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, TokenizeError::File(f) if f.is_not_found() && f.path().ends_with("tokenizer.json")),
        "{err}"
    );
    std::fs::write(dir.path().join("tokenizer.json"), "{not json").unwrap();
    assert!(matches!(
        Tokenizer::from_dir(dir.path()),
        Err(TokenizeError::Json { .. })
    ));
    std::fs::write(dir.path().join("tokenizer.json"), r#"{"model": {}}"#).unwrap();
    assert!(matches!(
        Tokenizer::from_dir(dir.path()),
        Err(TokenizeError::TokenizerLoad { .. })
    ));
    let tok = tokenizer();
    let big = tok.vocab_size() as u32;
    assert!(matches!(
        tok.decode(&[1, big], false),
        Err(TokenizeError::UnknownTokenId { .. })
    ));
    let mut det = tok.stream_detokenizer();
    assert!(matches!(
        det.push(big),
        Err(TokenizeError::UnknownTokenId { .. })
    ));
    assert!(matches!(
        ChatTemplate::new("{% if %}"),
        Err(TokenizeError::Template { .. })
    ));
}

#[test]
fn add_bos_eos_flags_are_ignored_like_transformers() {
    // transformers 5 drops add_bos_token / add_eos_token from tokenizer_config.json whenever a
    // tokenizer.json exists; only the file's post-processor counts (the goldens record it).
    let src = root().join(goldens()["tokenizer_dir"].as_str().unwrap());
    let variants = goldens()["bos_eos_variants"].as_array().unwrap();
    assert!(variants.len() >= 2);
    for v in variants {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            src.join("tokenizer.json"),
            dir.path().join("tokenizer.json"),
        )
        .unwrap();
        let mut cfg: Value = serde_json::from_str(
            &std::fs::read_to_string(src.join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        for (k, val) in v["config_patch"].as_object().unwrap() {
            cfg[k] = val.clone();
        }
        std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let tok = Tokenizer::from_dir(dir.path()).unwrap();
        for e in v["encode"].as_array().unwrap() {
            let text = e["text"].as_str().unwrap();
            let patch = &v["config_patch"];
            assert_eq!(
                tok.encode(text, true).unwrap(),
                ids(&e["ids_special"]),
                "{patch} {text:?}"
            );
            assert_eq!(
                tok.encode(text, false).unwrap(),
                ids(&e["ids_plain"]),
                "{patch} {text:?}"
            );
        }
    }
}

/// Writes the fixture tokenizer with the golden's `gemma_rebuild` mutation applied, and a
/// tokenizer_config.json with `tokenizer_class` kept or removed.
fn mutated_tokenizer_dir(keep_class: bool) -> tempfile::TempDir {
    let src = root().join(goldens()["tokenizer_dir"].as_str().unwrap());
    let spec = &goldens()["gemma_rebuild"];
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(src.join(name)).unwrap()).unwrap()
    };
    let mut tj = read("tokenizer.json");
    for k in spec["remove"].as_array().unwrap() {
        tj[k.as_str().unwrap()] = Value::Null;
    }
    for (k, v) in spec["model"].as_object().unwrap() {
        tj["model"][k] = v.clone();
    }
    let mut cfg = read("tokenizer_config.json");
    if !keep_class {
        cfg.as_object_mut().unwrap().remove("tokenizer_class");
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tj.to_string()).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn gemma_tokenizer_class_rebuilds_the_pipeline() {
    // transformers' GemmaTokenizer ignores tokenizer.json's normalizer, pre-tokenizer, decoder
    // and BPE flags (checked in the dump script); so must we.
    let dir = mutated_tokenizer_dir(true);
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    for (e, d) in goldens()["encode"]
        .as_array()
        .unwrap()
        .iter()
        .zip(goldens()["decode"].as_array().unwrap())
    {
        let text = e["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids(&e["ids_plain"]),
            "{text:?}"
        );
        assert_eq!(
            tok.decode(&ids(&d["ids"]), false).unwrap(),
            d["text"].as_str().unwrap()
        );
    }
    // Negative control: without the class the stripped file really does tokenize differently.
    let dir = mutated_tokenizer_dir(false);
    let raw = Tokenizer::from_dir(dir.path()).unwrap();
    let differs =
        goldens()["encode"].as_array().unwrap().iter().any(|e| {
            raw.encode(e["text"].as_str().unwrap(), false).ok() != Some(ids(&e["ids_plain"]))
        });
    assert!(
        differs,
        "the mutation must matter for this test to mean anything"
    );
}

#[test]
fn public_types_are_thread_safe() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<ChatTemplate>();
    assert_send_sync::<dg_tokenize::StreamDetokenizer>();
    assert_send_sync::<TokenizeError>();
}

#[test]
fn message_serializes_like_a_python_dict() {
    let m = Message::assistant("hi").with_field("reasoning", Value::from("r"));
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"{"role":"assistant","content":"hi","reasoning":"r"}"#
    );
    let parts = Message::user(vec![
        dg_tokenize::ContentPart::image(),
        dg_tokenize::ContentPart::text("t"),
    ]);
    assert_eq!(
        serde_json::to_string(&parts).unwrap(),
        r#"{"role":"user","content":[{"type":"image"},{"type":"text","text":"t"}]}"#
    );
}

/// Minimal SHA-256 (FIPS 180-4) so the test needs no extra crate.
fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes(chunk[4 * i..4 * i + 4].try_into().unwrap());
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let mut v = h;
        for i in 0..64 {
            let s1 = v[4].rotate_right(6) ^ v[4].rotate_right(11) ^ v[4].rotate_right(25);
            let ch = (v[4] & v[5]) ^ (!v[4] & v[6]);
            let t1 = v[7]
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = v[0].rotate_right(2) ^ v[0].rotate_right(13) ^ v[0].rotate_right(22);
            let maj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
            let t2 = s0.wrapping_add(maj);
            v = [
                t1.wrapping_add(t2),
                v[0],
                v[1],
                v[2],
                v[3].wrapping_add(t1),
                v[4],
                v[5],
                v[6],
            ];
        }
        for (a, b) in h.iter_mut().zip(v) {
            *a = a.wrapping_add(b);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}
