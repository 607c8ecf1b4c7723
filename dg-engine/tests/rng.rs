//! Bit-exact parity of `dg_engine::research::rng` with mlx 0.32.4 (CPU).
//!
//! Goldens: `tests/fixtures/goldens/rng.{safetensors,json}`, written by
//! `tools/reference/dump_rng_goldens.py`. Every value must be identical (integers exactly, f32 by
//! bit pattern): the RNG involves no tolerance.

mod common;

use std::collections::HashMap;

use common::key_of;
use dg_engine::research::rng::{self, Key, Rng};
use dg_testkit::{load_json, usizes, Tensors};
use serde_json::Value;

fn i32_of(v: &Value) -> i32 {
    i32::try_from(v.as_i64().expect("integer")).expect("fits i32")
}

fn f32_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn global_key_sequences_match_mlx() {
    let doc = load_json("rng.json");
    let t = Tensors::load("rng.safetensors");
    let vocab = doc["vocab"].as_u64().unwrap() as usize;
    let table = t.bf16_as_f32(doc["logits_table"].as_str().unwrap());
    let table_rows = doc["logits_table_rows"].as_u64().unwrap() as usize;
    assert_eq!(table.len(), table_rows * vocab);
    let mut checked = 0usize;
    for case in doc["sequences"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let shape = usizes(&case["shape"]);
        let states: Vec<Key> = case["states"]
            .as_array()
            .unwrap()
            .iter()
            .map(key_of)
            .collect();
        let mut rng = Rng::new(case["seed"].as_u64().unwrap());
        assert_eq!(rng.state(), states[0], "{name}: state after seed");
        for (i, call) in case["calls"].as_array().unwrap().iter().enumerate() {
            let out = call["out"].as_str().unwrap();
            match call["op"].as_str().unwrap() {
                "randint" => {
                    let (low, high) = (i32_of(&call["low"]), i32_of(&call["high"]));
                    let ours = rng.randint(low, high, &shape).unwrap();
                    assert_eq!(ours, t.i32(out), "{name}: {out}");
                    checked += ours.len();
                }
                "categorical" => {
                    let rows = call["logits_rows"].as_u64().unwrap() as usize;
                    let lshape = usizes(&call["logits_shape"]);
                    // Logits row r is table row r % table_rows.
                    let logits: Vec<f32> = (0..rows)
                        .flat_map(|r| {
                            let start = (r % table_rows) * vocab;
                            table[start..start + vocab].iter().copied()
                        })
                        .collect();
                    let ours = rng.categorical(&logits, &lshape).unwrap();
                    assert_eq!(ours, t.u32(out), "{name}: {out}");
                    checked += ours.len();
                }
                "uniform" => {
                    let ours = rng.uniform(&shape).unwrap();
                    assert_eq!(f32_bits(&ours), f32_bits(t.f32(out)), "{name}: {out}");
                    checked += ours.len();
                }
                op => panic!("unknown op {op}"),
            }
            assert_eq!(rng.state(), states[i + 1], "{name}: state after call {i}");
        }
    }
    assert!(checked > 5000, "only {checked} values checked");
}

#[test]
fn seeds_give_mlx_keys() {
    let doc = load_json("rng.json");
    let cases = doc["seed_keys"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for case in cases {
        let seed: u64 = case["seed"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            Rng::new(seed).state(),
            key_of(&case["state"]),
            "seed {seed}"
        );
        assert_eq!(rng::key(seed), key_of(&case["key"]), "key({seed})");
    }
}

#[test]
fn keyed_calls_match_mlx() {
    let doc = load_json("rng.json");
    let t = Tensors::load("rng.safetensors");
    let mut counts: HashMap<String, usize> = HashMap::new();
    for case in doc["keyed"].as_array().unwrap() {
        let op = case["op"].as_str().unwrap();
        let key = key_of(&case["key"]);
        let out = case["out"].as_str().unwrap();
        match op {
            "uniform" => {
                let ours = rng::uniform_with_key(key, &usizes(&case["shape"])).unwrap();
                assert_eq!(f32_bits(&ours), f32_bits(t.f32(out)), "{out}");
            }
            "uniform_range" => {
                let (low, high) = (
                    case["low"].as_f64().unwrap() as f32,
                    case["high"].as_f64().unwrap() as f32,
                );
                let ours =
                    rng::uniform_range_with_key(key, low, high, &usizes(&case["shape"])).unwrap();
                assert_eq!(f32_bits(&ours), f32_bits(t.f32(out)), "{out}");
            }
            "gumbel" => {
                let ours = rng::gumbel_with_key(key, &usizes(&case["shape"])).unwrap();
                assert_eq!(f32_bits(&ours), f32_bits(t.f32(out)), "{out}");
            }
            "split" => {
                let num = case["num"].as_u64().unwrap() as usize;
                let ours: Vec<u32> = rng::split_n(key, num).unwrap().concat();
                assert_eq!(ours, t.u32(out), "{out}");
                if num == 2 {
                    let (a, b) = rng::split(key);
                    assert_eq!([a, b].concat(), ours, "{out}: split pair");
                }
            }
            "randint" => {
                let (low, high) = (i32_of(&case["low"]), i32_of(&case["high"]));
                let ours = rng::randint_with_key(key, low, high, &usizes(&case["shape"])).unwrap();
                assert_eq!(ours, t.i32(out), "{out}: randint({low}, {high})");
            }
            "categorical" => {
                let logits = t.f32(case["logits"].as_str().unwrap());
                let shape = usizes(&case["logits_shape"]);
                let ours = rng::categorical_with_key(key, logits, &shape).unwrap();
                let note = case["note"].as_str().unwrap();
                assert_eq!(ours, t.u32(out), "{out}: {note}");
            }
            op => panic!("unknown op {op}"),
        }
        *counts.entry(op.to_string()).or_default() += 1;
    }
    for op in [
        "uniform",
        "uniform_range",
        "gumbel",
        "split",
        "randint",
        "categorical",
    ] {
        assert!(
            counts.get(op).copied().unwrap_or(0) >= 5,
            "{op}: {counts:?}"
        );
    }
}

/// The two categorical paths really differ: the goldens would not notice a swap otherwise.
#[test]
fn categorical_paths_differ_for_one_row() {
    let doc = load_json("rng.json");
    let t = Tensors::load("rng.safetensors");
    let vocab = doc["vocab"].as_u64().unwrap() as usize;
    let table = t.bf16_as_f32("logits_table");
    let row = &table[..vocab];
    let mut differ = 0;
    for seed in 0..20u64 {
        let k = rng::key(seed);
        let inverse_cdf = rng::categorical_with_key(k, row, &[1, vocab]).unwrap();
        let gumbel = rng::categorical_with_key(k, row, &[vocab]).unwrap();
        differ += usize::from(inverse_cdf != gumbel);
    }
    assert!(differ >= 10, "paths agree on {} of 20 keys", 20 - differ);
}
