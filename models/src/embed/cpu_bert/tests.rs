use std::collections::HashMap;

use candle_nn::VarBuilder;

use super::*;
use crate::embed::bert::BertConfig;
use crate::embed::encoder::pool;

const HIDDEN: usize = 32;
const WIDE: usize = 64;
const POSITIONS: usize = 320;

/// A two-layer model with random weights: BERT names, or MPNet's (relative attention bias,
/// positions after the padding id, no token types).
fn tiny_model(mpnet: bool) -> FastBert {
    let (config, tensors) = tiny_weights(mpnet);
    load(config, tensors, DType::F32)
}

fn load(config: BertConfig, tensors: HashMap<String, Tensor>, dtype: DType) -> FastBert {
    let vb = VarBuilder::from_tensors(tensors, dtype, &Device::Cpu);
    FastBert::load(config, vb).unwrap()
}

fn tiny_weights(mpnet: bool) -> (BertConfig, HashMap<String, Tensor>) {
    tiny_weights_of_heads(mpnet, 4)
}

/// The same with `heads` attention heads (one head of 32 is a width the GPU's flash
/// attention takes).
fn tiny_weights_of_heads(mpnet: bool, heads: usize) -> (BertConfig, HashMap<String, Tensor>) {
    let mut config = serde_json::json!({
        "vocab_size": 50, "hidden_size": HIDDEN, "num_hidden_layers": 2,
        "num_attention_heads": heads, "intermediate_size": WIDE,
        "max_position_embeddings": POSITIONS, "layer_norm_eps": 1e-12
    });
    if mpnet {
        config["model_type"] = "mpnet".into();
        config["pad_token_id"] = 1.into();
        config["relative_attention_num_buckets"] = 32.into();
    }
    let config: BertConfig = serde_json::from_value(config).unwrap();
    let mut tensors = HashMap::new();
    let mut put = |name: String, shape: &[usize]| {
        let t = Tensor::randn(0f32, 0.3, shape, &Device::Cpu).unwrap();
        tensors.insert(name, t);
    };
    put("embeddings.word_embeddings.weight".into(), &[50, HIDDEN]);
    put(
        "embeddings.position_embeddings.weight".into(),
        &[POSITIONS, HIDDEN],
    );
    if mpnet {
        put(
            "encoder.relative_attention_bias.weight".into(),
            &[32, heads],
        );
    } else {
        put(
            "embeddings.token_type_embeddings.weight".into(),
            &[2, HIDDEN],
        );
    }
    let norm = |put: &mut dyn FnMut(String, &[usize]), prefix: String| {
        put(format!("{prefix}.weight"), &[HIDDEN]);
        put(format!("{prefix}.bias"), &[HIDDEN]);
    };
    norm(&mut put, "embeddings.LayerNorm".into());
    let (q, k, v, o, attention_norm) = if mpnet {
        ("attn.q", "attn.k", "attn.v", "attn.o", "LayerNorm")
    } else {
        (
            "self.query",
            "self.key",
            "self.value",
            "output.dense",
            "output.LayerNorm",
        )
    };
    for i in 0..2 {
        let l = format!("encoder.layer.{i}");
        for part in [q, k, v, o] {
            put(format!("{l}.attention.{part}.weight"), &[HIDDEN, HIDDEN]);
            put(format!("{l}.attention.{part}.bias"), &[HIDDEN]);
        }
        norm(&mut put, format!("{l}.attention.{attention_norm}"));
        put(format!("{l}.intermediate.dense.weight"), &[WIDE, HIDDEN]);
        put(format!("{l}.intermediate.dense.bias"), &[WIDE]);
        put(format!("{l}.output.dense.weight"), &[HIDDEN, WIDE]);
        put(format!("{l}.output.dense.bias"), &[HIDDEN]);
        norm(&mut put, format!("{l}.output.LayerNorm"));
    }
    (config, tensors)
}

/// Right-padded ids and mask for sequences of these lengths.
fn batch(lengths: &[usize]) -> (Tensor, Tensor) {
    let longest = *lengths.iter().max().unwrap();
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for (s, &len) in lengths.iter().enumerate() {
        for i in 0..longest {
            ids.push(if i < len {
                ((s * 7 + i * 3) % 50) as u32
            } else {
                0
            });
            mask.push(u32::from(i < len));
        }
    }
    let shape = (lengths.len(), longest);
    let ids = Tensor::from_vec(ids, shape, &Device::Cpu).unwrap();
    let mask = Tensor::from_vec(mask, shape, &Device::Cpu).unwrap();
    (ids, mask)
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Hidden states of real tokens and mean-pooled, normalised vectors from both forwards,
/// on one thread and on three (more than one row block, so blocks run in parallel).
#[test]
fn matches_the_tensor_forward_on_one_thread_and_several() {
    assert_packed_matches_tensor_forward(tiny_model(false), &[300, 7, 250, 1]);
}

/// MPNet's positions start after the padding id, so its longest sequence is 2 shorter.
#[test]
fn mpnet_matches_the_tensor_forward_on_one_thread_and_several() {
    assert_packed_matches_tensor_forward(tiny_model(true), &[POSITIONS - 2, 7, 250, 1]);
}

fn assert_packed_matches_tensor_forward(mut reference: FastBert, lengths: &[usize]) {
    let mut packed = CpuBert::from_model(&reference).unwrap();
    let (ids, mask) = batch(lengths);
    let expected_hidden = reference.forward(&ids, &mask).unwrap();
    let expected_pooled = pool(
        &expected_hidden,
        &mask,
        Pooling::Mean,
        PaddingSide::Right,
        true,
    )
    .unwrap()
    .to_vec2::<f32>()
    .unwrap();
    let keep = mask.to_dtype(DType::F32).unwrap().unsqueeze(2).unwrap();
    let real = |hidden: &Tensor| {
        let masked = hidden.broadcast_mul(&keep).unwrap();
        masked.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    };
    let sequences = unpadded(&ids, &mask).unwrap();
    let sequences: Vec<&[u32]> = sequences.iter().map(Vec::as_slice).collect();
    for threads in [1, 3] {
        let workers = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let (hidden, pooled) = workers.install(|| {
            let hidden = packed.forward(&ids, &mask).unwrap();
            let pooled = packed.embed_unpadded(&sequences, Pooling::Mean, true);
            (hidden, pooled.unwrap().unwrap())
        });
        let off = max_difference(&real(&hidden), &real(&expected_hidden));
        assert!(
            off < 1e-4,
            "{threads} thread(s): hidden states off by {off}"
        );
        for (ours, theirs) in pooled.iter().zip(&expected_pooled) {
            let off = max_difference(ours, theirs);
            assert!(
                off < 1e-5,
                "{threads} thread(s): pooled vector off by {off}"
            );
        }
    }
}

/// f16 (what GPUs run) on a padded batch: the padding mask must not turn into NaN
/// (f32::MIN is -inf in f16, and 0 x -inf is NaN), and vectors match f32 closely.
#[test]
fn f16_padded_batches_are_finite_and_match_f32() {
    for mpnet in [false, true] {
        let (config, tensors) = tiny_weights(mpnet);
        let mut wide = load(config.clone(), tensors.clone(), DType::F32);
        let mut half = load(config, tensors, DType::F16);
        let (ids, mask) = batch(&[40, 9, 23]);
        let vectors = |model: &mut FastBert| {
            let hidden = model.forward(&ids, &mask).unwrap();
            pool(&hidden, &mask, Pooling::Mean, PaddingSide::Right, true)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
        };
        let (expected, got) = (vectors(&mut wide), vectors(&mut half));
        for (ours, theirs) in got.iter().zip(&expected) {
            assert!(
                ours.iter().all(|v| v.is_finite()),
                "mpnet={mpnet}: {ours:?}"
            );
            let off = max_difference(ours, theirs);
            assert!(off < 2e-2, "mpnet={mpnet}: f16 off by {off}");
        }
    }
}

/// On a GPU in f16, where attention is the flash kernel (padding mask, MPNet's relative
/// bias): vectors match the CPU's f32 forward as closely as f16 allows.
#[cfg(feature = "cuda")]
#[test]
fn flash_attention_on_a_gpu_matches_the_cpu_forward() {
    let Some(gpu) = crate::device::test_gpu() else {
        return;
    };
    assert!(crate::embed::flash_attention::flash_attention_fits(
        &gpu,
        DType::F16,
        HIDDEN
    ));
    for mpnet in [false, true] {
        let (config, tensors) = tiny_weights_of_heads(mpnet, 1);
        let mut wide = load(config.clone(), tensors.clone(), DType::F32);
        let vb = VarBuilder::from_tensors(tensors, DType::F16, &gpu);
        let mut half = FastBert::load(config, vb).unwrap();
        let (ids, mask) = batch(&[140, 9, 70]);
        let expected = {
            let hidden = wide.forward(&ids, &mask).unwrap();
            pool(&hidden, &mask, Pooling::Mean, PaddingSide::Right, true)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
        };
        let (ids, mask) = (ids.to_device(&gpu).unwrap(), mask.to_device(&gpu).unwrap());
        let hidden = half.forward(&ids, &mask).unwrap();
        let got = pool(&hidden, &mask, Pooling::Mean, PaddingSide::Right, true)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (ours, theirs) in got.iter().zip(&expected) {
            let off = max_difference(ours, theirs);
            assert!(off < 2e-2, "mpnet={mpnet}: GPU f16 off by {off}");
        }
    }
}

#[test]
fn cls_and_last_token_pooling_pick_their_rows() {
    let rows: Vec<f32> = (0..3 * 4).map(|v| v as f32).collect();
    assert_eq!(pool_rows(&rows, 4, Pooling::Cls), vec![0.0, 1.0, 2.0, 3.0]);
    assert_eq!(
        pool_rows(&rows, 4, Pooling::LastToken),
        vec![8.0, 9.0, 10.0, 11.0]
    );
    assert_eq!(pool_rows(&rows, 4, Pooling::Mean), vec![4.0, 5.0, 6.0, 7.0]);
}

#[test]
fn ids_past_the_vocabulary_or_positions_are_errors() {
    let mut packed = CpuBert::from_model(&tiny_model(false)).unwrap();
    let too_long = vec![1u32; POSITIONS + 1];
    let error = packed.embed_unpadded(&[&too_long], Pooling::Mean, true);
    let message = error.unwrap().unwrap_err().to_string();
    assert!(message.contains("longer than the model's"), "{message}");
    let error = packed.embed_unpadded(&[&[1, 99, 2]], Pooling::Mean, true);
    let message = error.unwrap().unwrap_err().to_string();
    assert!(message.contains("token id 99 out of range"), "{message}");
    let mut mpnet = CpuBert::from_model(&tiny_model(true)).unwrap();
    let too_long = vec![3u32; POSITIONS - 1];
    let error = mpnet.embed_unpadded(&[&too_long], Pooling::Mean, true);
    let message = error.unwrap().unwrap_err().to_string();
    assert!(
        message.contains("318 positions"),
        "MPNet's 2 reserved positions are not usable: {message}"
    );
}
