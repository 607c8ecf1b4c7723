//! Random-weight checkpoints of any size in the real on-disk format (config.json with the
//! reference's schema and per-module quantization entries, MLX-affine packed safetensors, optional
//! shards with an index, generation_config.json, a byte-level tokenizer). For benches, examples
//! and tests; the committed parity fixtures come from the reference's own writer
//! (tools/reference/make_checkpoints.py).
//!
//! The weights follow the fixtures' recipe (tools/reference/README.md) in spirit (heavy-tailed
//! tied embedding rows, signed final-norm weights, soft attention, small branch outputs, a
//! damped self-conditioning projection) so predictions are peaked rather than uniform.

use std::collections::BTreeMap;
use std::path::Path;

use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;

use crate::error::CoreError;

/// Size and layout of a synthetic checkpoint.
#[derive(Clone, Debug)]
pub struct SyntheticSpec {
    /// `text_config.vocab_size`.
    pub vocab_size: usize,
    /// `text_config.hidden_size`.
    pub hidden_size: usize,
    /// `text_config.intermediate_size` (dense MLP).
    pub intermediate_size: usize,
    /// `text_config.moe_intermediate_size` (each expert).
    pub moe_intermediate_size: usize,
    /// `text_config.num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `text_config.num_attention_heads`.
    pub num_attention_heads: usize,
    /// `text_config.num_key_value_heads` (sliding layers).
    pub num_key_value_heads: usize,
    /// `text_config.num_global_key_value_heads` (full-attention layers).
    pub num_global_key_value_heads: usize,
    /// `text_config.head_dim` (sliding layers).
    pub head_dim: usize,
    /// `text_config.global_head_dim` (full-attention layers).
    pub global_head_dim: usize,
    /// `text_config.num_experts`.
    pub num_experts: usize,
    /// `text_config.top_k_experts`.
    pub top_k_experts: usize,
    /// `text_config.sliding_window`, in tokens.
    pub sliding_window: usize,
    /// `canvas_length`: tokens per denoising block.
    pub canvas_length: usize,
    /// Number of safetensors shards (1 writes `model.safetensors`).
    pub shards: usize,
    /// Seed of the random weights.
    pub seed: u64,
}

impl Default for SyntheticSpec {
    /// A small model that loads and runs in well under a second.
    fn default() -> Self {
        SyntheticSpec {
            vocab_size: 512,
            hidden_size: 64,
            intermediate_size: 128,
            moe_intermediate_size: 64,
            num_hidden_layers: 6,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            num_global_key_value_heads: 1,
            head_dim: 16,
            global_head_dim: 32,
            num_experts: 8,
            top_k_experts: 2,
            sliding_window: 8,
            canvas_length: 16,
            shards: 1,
            seed: 0,
        }
    }
}

/// The real Gemma 4 chat template (see dg-core/assets/SOURCE.md).
const GEMMA4_CHAT_TEMPLATE: &str = include_str!("../assets/chat_template.jinja");

/// Special token ids of the synthetic byte-level tokenizer (Gemma's ids).
const SPECIALS: [(&str, u32); 7] = [
    ("<pad>", 0),
    ("<eos>", 1),
    ("<bos>", 2),
    ("<unk>", 3),
    ("<mask>", 4),
    ("<|turn>", 105),
    ("<turn|>", 106),
];

/// Tensors spilled to a scratch file as they are generated (memory bounded by the largest
/// tensor, not the checkpoint), then laid out into the safetensors files from a mapping of it.
struct Spill {
    file: std::io::BufWriter<std::fs::File>,
    path: std::path::PathBuf,
    len: usize,
    /// The first write error; reported once all tensors are generated.
    error: Option<std::io::Error>,
}

/// A spilled tensor: dtype, shape and its bytes' range in the spill file.
type Spilled = (Dtype, Vec<usize>, std::ops::Range<usize>);

struct Writer {
    rng: StdRng,
    spill: Spill,
    tensors: BTreeMap<String, Spilled>,
    quant_overrides: BTreeMap<String, serde_json::Value>,
}

impl Writer {
    fn put(&mut self, name: String, dtype: Dtype, shape: Vec<usize>, bytes: &[u8]) {
        use std::io::Write;
        let spill = &mut self.spill;
        if spill.error.is_none() {
            if let Err(e) = spill.file.write_all(bytes) {
                spill.error = Some(e);
            }
        }
        let range = spill.len..spill.len + bytes.len();
        spill.len += bytes.len();
        self.tensors.insert(name, (dtype, shape, range));
    }

    fn normal(&mut self) -> f32 {
        // Box-Muller; enough for synthetic weights.
        let u1: f32 = self.rng.gen_range(f32::EPSILON..1.0);
        let u2: f32 = self.rng.gen();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }

    fn randn(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * std).collect()
    }

    fn put_bf16(&mut self, name: &str, shape: &[usize], values: &[f32]) {
        let bytes: Vec<u8> = values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        self.put(name.into(), Dtype::BF16, shape.to_vec(), &bytes);
    }

    /// Quantizes `[lead.., rows, cols]` weights and stores weight/scales/biases like MLX.
    fn put_quantized(
        &mut self,
        path: &str,
        lead: &[usize],
        rows: usize,
        cols: usize,
        w: &[f32],
        bits: u32,
    ) -> Result<(), CoreError> {
        let spec = dg_quant::QuantSpec::new(bits, 64).map_err(|source| CoreError::Quant {
            name: path.into(),
            source,
        })?;
        let matrices = lead.iter().product::<usize>().max(1);
        let (mut packed, mut scales, mut biases) = (Vec::new(), Vec::new(), Vec::new());
        // Rows quantize independently: blocks of rows bound the rounded copy's memory.
        const BLOCK_ROWS: usize = 4096;
        for block in w[..matrices * rows * cols].chunks(BLOCK_ROWS * cols.max(1)) {
            // Round to bf16 first: the reference quantizes bf16 weights.
            let block: Vec<f32> = block.iter().map(|v| bf16::from_f32(*v).to_f32()).collect();
            let q = dg_quant::quantize(&block, block.len() / cols.max(1), cols, spec).map_err(
                |source| CoreError::Quant {
                    name: path.into(),
                    source,
                },
            )?;
            packed.extend(q.packed);
            scales.extend(q.scales);
            biases.extend(q.biases);
        }
        let shape = |last: usize| [lead, &[rows, last]].concat();
        self.put(
            format!("{path}.weight"),
            Dtype::U32,
            shape(cols * bits as usize / 32),
            bytemuck::cast_slice(&packed),
        );
        for (suffix, values) in [("scales", scales), ("biases", biases)] {
            self.put(
                format!("{path}.{suffix}"),
                Dtype::BF16,
                shape(cols / 64),
                bytemuck::cast_slice(&values),
            );
        }
        if bits != 4 {
            self.quant_overrides
                .insert(path.into(), json!({"group_size": 64, "bits": bits}));
        }
        Ok(())
    }

    fn linear(
        &mut self,
        path: &str,
        out: usize,
        inp: usize,
        gain: f32,
        bits: u32,
    ) -> Result<(), CoreError> {
        let w = self.randn(out * inp, gain / (inp as f32).sqrt());
        self.put_quantized(path, &[], out, inp, &w, bits)
    }

    fn norm(&mut self, name: &str, dim: usize, lo: f32, hi: f32, random_sign: bool) {
        let values: Vec<f32> = (0..dim)
            .map(|_| {
                let v = self.rng.gen_range(lo..hi);
                if random_sign && self.rng.gen_bool(0.5) {
                    -v
                } else {
                    v
                }
            })
            .collect();
        self.put_bf16(&format!("{name}.weight"), &[dim], &values);
    }
}

/// Writes a random checkpoint described by `spec` into `dir` (created if needed).
pub fn write_checkpoint(dir: &Path, spec: &SyntheticSpec) -> Result<(), CoreError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| CoreError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let s = spec;
    let spill_path = dir.join(".synthetic-tensors.tmp");
    let spill_file = std::fs::File::create(&spill_path).map_err(io(&spill_path))?;
    let mut w = Writer {
        rng: StdRng::seed_from_u64(s.seed),
        spill: Spill {
            file: std::io::BufWriter::with_capacity(1 << 20, spill_file),
            path: spill_path,
            len: 0,
            error: None,
        },
        tensors: BTreeMap::new(),
        quant_overrides: BTreeMap::new(),
    };
    let h = s.hidden_size;

    // Tied embedding: heavy-tailed row norms make the top-1 logit stand out.
    let mut embed = Vec::with_capacity(s.vocab_size * h);
    for _ in 0..s.vocab_size {
        let norm = (0.8 * w.normal()).exp();
        let row = w.randn(h, norm / (h as f32).sqrt());
        embed.extend(row);
    }
    w.put_quantized(
        "model.decoder.embed_tokens",
        &[],
        s.vocab_size,
        h,
        &embed,
        4,
    )?;
    drop(embed);
    w.norm("model.decoder.norm", h, 1.5, 2.5, true);

    let pattern_full = |i: usize| i % 6 == 5 || i + 1 == s.num_hidden_layers;
    for i in 0..s.num_hidden_layers {
        let p = format!("model.decoder.layers.{i}");
        let full = pattern_full(i);
        let (hd, kv) = if full {
            (s.global_head_dim, s.num_global_key_value_heads)
        } else {
            (s.head_dim, s.num_key_value_heads)
        };
        let heads = s.num_attention_heads;
        w.linear(&format!("{p}.self_attn.q_proj"), heads * hd, h, 1.0, 8)?;
        w.linear(&format!("{p}.self_attn.k_proj"), kv * hd, h, 1.0, 8)?;
        if !full {
            w.linear(&format!("{p}.self_attn.v_proj"), kv * hd, h, 1.0, 8)?;
        }
        w.linear(&format!("{p}.self_attn.o_proj"), h, heads * hd, 1.0, 8)?;
        w.norm(&format!("{p}.self_attn.q_norm"), hd, 0.4, 0.7, false);
        w.norm(&format!("{p}.self_attn.k_norm"), hd, 0.4, 0.7, false);
        w.linear(
            &format!("{p}.mlp.gate_proj"),
            s.intermediate_size,
            h,
            1.0,
            8,
        )?;
        w.linear(&format!("{p}.mlp.up_proj"), s.intermediate_size, h, 1.0, 8)?;
        w.linear(
            &format!("{p}.mlp.down_proj"),
            h,
            s.intermediate_size,
            1.0,
            8,
        )?;
        w.linear(&format!("{p}.router.proj"), s.num_experts, h, 4.0, 8)?;
        let scale: Vec<f32> = (0..h).map(|_| w.rng.gen_range(0.8..1.2)).collect();
        w.put_bf16(&format!("{p}.router.scale"), &[h], &scale);
        let per_expert: Vec<f32> = (0..s.num_experts)
            .map(|_| w.rng.gen_range(0.5..1.5))
            .collect();
        w.put_bf16(
            &format!("{p}.router.per_expert_scale"),
            &[s.num_experts],
            &per_expert,
        );
        let m = s.moe_intermediate_size;
        let gate_up = w.randn(s.num_experts * 2 * m * h, 1.0 / (h as f32).sqrt());
        w.put_quantized(
            &format!("{p}.experts.gate_up_proj"),
            &[s.num_experts],
            2 * m,
            h,
            &gate_up,
            4,
        )?;
        drop(gate_up);
        let down = w.randn(s.num_experts * h * m, 1.0 / (m as f32).sqrt());
        w.put_quantized(
            &format!("{p}.experts.down_proj"),
            &[s.num_experts],
            h,
            m,
            &down,
            4,
        )?;
        for norm in [
            "input_layernorm",
            "pre_feedforward_layernorm",
            "pre_feedforward_layernorm_2",
        ] {
            w.norm(&format!("{p}.{norm}"), h, 0.8, 1.2, false);
        }
        for norm in [
            "post_attention_layernorm",
            "post_feedforward_layernorm",
            "post_feedforward_layernorm_1",
            "post_feedforward_layernorm_2",
        ] {
            w.norm(&format!("{p}.{norm}"), h, 0.2, 0.5, false);
        }
        let scalar = w.rng.gen_range(0.8..1.2);
        w.put_bf16(&format!("{p}.layer_scalar"), &[1], &[scalar]);
        let scalar = w.rng.gen_range(0.8..1.2);
        w.put_bf16(
            &format!("model.encoder.language_model.layers.{i}.layer_scalar"),
            &[1],
            &[scalar],
        );
    }
    let sc = "model.decoder.self_conditioning";
    w.norm(&format!("{sc}.pre_norm"), h, 0.8, 1.2, false);
    w.linear(&format!("{sc}.gate_proj"), s.intermediate_size, h, 1.0, 4)?;
    w.linear(&format!("{sc}.up_proj"), s.intermediate_size, h, 1.0, 4)?;
    // A damped feedback keeps the self-conditioning loop contractive.
    w.linear(&format!("{sc}.down_proj"), h, s.intermediate_size, 0.1, 4)?;

    let written = finish_spill(&mut w.spill).and_then(|()| {
        let map = crate::mmap::MappedFile::open(&w.spill.path)?;
        write_tensors(dir, &w.tensors, map.bytes(), s.shards.max(1))
    });
    // The scratch file goes whatever happened; the first error is the one reported.
    let removed = std::fs::remove_file(&w.spill.path).map_err(io(&w.spill.path));
    written.and(removed)?;
    write_json(dir, "config.json", &config_json(s, &w.quant_overrides))?;
    write_json(
        dir,
        "generation_config.json",
        &json!({"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}),
    )?;
    write_json(dir, "tokenizer.json", &byte_level_tokenizer(s.vocab_size))?;
    let template = dir.join("chat_template.jinja");
    std::fs::write(&template, GEMMA4_CHAT_TEMPLATE).map_err(io(&template))?;
    write_json(
        dir,
        "tokenizer_config.json",
        &json!({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                "add_bos_token": false, "add_eos_token": false}),
    )?;
    Ok(())
}

fn config_json(
    s: &SyntheticSpec,
    overrides: &BTreeMap<String, serde_json::Value>,
) -> serde_json::Value {
    let mut quant = json!({"group_size": 64, "bits": 4, "mode": "affine"});
    for (k, v) in overrides {
        quant[k] = v.clone();
    }
    json!({
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "model_type": "diffusion_gemma",
        "dtype": "bfloat16",
        "boi_token_id": 5,
        "eoi_token_id": 6,
        "image_token_id": 7,
        "canvas_length": s.canvas_length,
        "eos_token_id": [1, 106],
        "tie_word_embeddings": true,
        "vision_soft_tokens_per_image": 280,
        "quantization": quant.clone(),
        "quantization_config": quant,
        "text_config": {
            "model_type": "diffusion_gemma_text",
            "vocab_size": s.vocab_size,
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "moe_intermediate_size": s.moe_intermediate_size,
            "num_hidden_layers": s.num_hidden_layers,
            "num_attention_heads": s.num_attention_heads,
            "num_key_value_heads": s.num_key_value_heads,
            "num_global_key_value_heads": s.num_global_key_value_heads,
            "head_dim": s.head_dim,
            "global_head_dim": s.global_head_dim,
            "num_experts": s.num_experts,
            "top_k_experts": s.top_k_experts,
            "sliding_window": s.sliding_window,
            "rms_norm_eps": 1e-6,
            "final_logit_softcapping": 30.0,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": true,
            "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
        },
        "vision_config": null,
    })
}

/// A byte-level BPE tokenizer without merges: Gemma's special tokens at Gemma's ids, then one
/// token per byte, then filler tokens up to `vocab_size`.
fn byte_level_tokenizer(vocab_size: usize) -> serde_json::Value {
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (tok, id) in SPECIALS {
        vocab.insert(tok.into(), json!(id));
        added.push(
            json!({"id": id, "content": tok, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}),
        );
    }
    let mut next = 8u32;
    let used: Vec<u32> = SPECIALS.iter().map(|s| s.1).collect();
    for c in gpt2_byte_chars() {
        while used.contains(&next) {
            next += 1;
        }
        vocab.insert(c.to_string(), json!(next));
        next += 1;
    }
    while (next as usize) < vocab_size {
        if !used.contains(&next) {
            vocab.insert(format!("<unused{next}>"), json!(next));
        }
        next += 1;
    }
    json!({
        "version": "1.0",
        "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
}

/// The GPT-2 byte-to-unicode table used by byte-level BPE.
fn gpt2_byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut extra = 0;
    let mut chars = vec!['\0'; 256];
    for b in 0..256u32 {
        if printable.contains(&b) {
            chars[b as usize] = char::from_u32(b).unwrap_or('?');
        } else {
            chars[b as usize] = char::from_u32(256 + extra).unwrap_or('?');
            extra += 1;
        }
    }
    printable.clear();
    chars
}

fn write_json(dir: &Path, name: &str, value: &serde_json::Value) -> Result<(), CoreError> {
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(value).map_err(|source| CoreError::Json {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, text).map_err(|source| CoreError::Io { path, source })
}

/// Flushes the spill file, or returns its first write error.
fn finish_spill(spill: &mut Spill) -> Result<(), CoreError> {
    use std::io::Write;
    let path = spill.path.clone();
    let err = |source| CoreError::Io { path, source };
    if let Some(e) = spill.error.take() {
        return Err(err(e));
    }
    spill.file.flush().map_err(err)
}

fn write_tensors(
    dir: &Path,
    tensors: &BTreeMap<String, Spilled>,
    data: &[u8],
    shards: usize,
) -> Result<(), CoreError> {
    let names: Vec<&String> = tensors.keys().collect();
    let per_shard = names.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    let metadata = Some(std::collections::HashMap::from([(
        "format".to_string(),
        "mlx".to_string(),
    )]));
    let total: usize = tensors.values().map(|t| t.2.len()).sum();
    for (i, chunk) in names.chunks(per_shard.max(1)).enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, shards)
        };
        let views = chunk
            .iter()
            .map(|name| {
                let (dtype, shape, range) = &tensors[*name];
                TensorView::new(*dtype, shape.clone(), &data[range.clone()])
                    .map(|v| ((*name).clone(), v))
                    .map_err(|e| CoreError::InvalidInput(format!("{name}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for name in chunk {
            weight_map.insert((*name).clone(), json!(file));
        }
        let path = dir.join(&file);
        safetensors::serialize_to_file(views, metadata.clone(), &path).map_err(|e| {
            CoreError::Checkpoint {
                path: path.clone(),
                reason: e.to_string(),
            }
        })?;
    }
    if shards > 1 {
        write_json(
            dir,
            "model.safetensors.index.json",
            &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
        )?;
    }
    Ok(())
}
