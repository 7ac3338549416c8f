//! The `classifier` trial: logistic regression (`hidden = 0`) or a one-hidden-layer MLP with
//! dropout on frozen embeddings, trained with AdamW; metric accuracy or macro-F1.

use candle_core::{DType, Device, Result, Tensor, Var};
use resident_proto::{SeededRng, pb};
use serde::Deserialize;

use super::dataset::LoadedDataset;
use super::metrics;
use super::optim::AdamW;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifierParams {
    #[serde(default = "default_lr")]
    pub lr: f64,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default)]
    pub hidden: usize,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Caps the trial's epochs; the sweep's runner applies it.
    #[serde(default)]
    pub epochs: Option<u32>,
}

pub(super) fn default_lr() -> f64 {
    1e-3
}

pub(super) fn default_batch() -> usize {
    64
}

/// Glorot-uniform weights from the trial's seed.
pub(super) fn init_var(
    rows: usize,
    cols: usize,
    rng: &mut SeededRng,
    device: &Device,
) -> Result<Var> {
    let bound = (6.0 / (rows + cols) as f64).sqrt();
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
        .collect();
    Var::from_tensor(&Tensor::from_vec(values, (rows, cols), device)?)
}

struct Classifier {
    layers: Vec<(Var, Var)>,
    dropout: f64,
}

impl Classifier {
    fn new(
        dim: usize,
        classes: usize,
        hidden: usize,
        dropout: f64,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        let mut rng = SeededRng::derived(seed, u64::MAX);
        let sizes = if hidden == 0 {
            vec![(dim, classes)]
        } else {
            vec![(dim, hidden), (hidden, classes)]
        };
        let layers = sizes
            .into_iter()
            .map(|(i, o)| {
                Ok((
                    init_var(i, o, &mut rng, device)?,
                    Var::zeros(o, DType::F32, device)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, dropout })
    }

    fn named(&self) -> Vec<(String, Var)> {
        let mut out = Vec::new();
        for (i, (w, b)) in self.layers.iter().enumerate() {
            out.push((format!("w{i}"), w.clone()));
            out.push((format!("b{i}"), b.clone()));
        }
        out
    }

    /// Logits; with `rng`, hidden units are dropped (training).
    fn forward(&self, x: &Tensor, rng: Option<&mut SeededRng>) -> Result<Tensor> {
        let (w, b) = &self.layers[0];
        let mut h = x.matmul(w.as_tensor())?.broadcast_add(b.as_tensor())?;
        if let Some((w2, b2)) = self.layers.get(1) {
            h = h.relu()?;
            if let Some(rng) = rng.filter(|_| self.dropout > 0.0) {
                let keep = 1.0 - self.dropout;
                let mask: Vec<f32> = (0..h.elem_count())
                    .map(|_| {
                        if rng.next_f64() < keep {
                            (1.0 / keep) as f32
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let mask = Tensor::from_vec(mask, h.dims(), x.device())?;
                h = (h * mask)?;
            }
            h = h.matmul(w2.as_tensor())?.broadcast_add(b2.as_tensor())?;
        }
        Ok(h)
    }
}

/// Trains epochs `(start, end]` from `checkpoint`; returns each epoch's metric.
pub fn train(
    data: &LoadedDataset,
    params: &ClassifierParams,
    request: &pb::TrialRequest,
) -> Result<(Vec<f64>, pb::TrialCheckpoint)> {
    let device = data.vectors.device();
    let model = Classifier::new(
        data.dim,
        data.classes,
        params.hidden,
        params.dropout.clamp(0.0, 0.95),
        request.trial_seed,
        device,
    )?;
    let mut optimizer = AdamW::new(
        model.named(),
        params.lr,
        params.weight_decay,
        request.checkpoint.as_ref(),
    )?;
    let labels = |rows: &[u32]| -> Result<Tensor> {
        let values: Vec<u32> = rows.iter().map(|r| data.labels[*r as usize]).collect();
        Tensor::from_vec(values, rows.len(), device)
    };
    let rows_of = |rows: &[u32]| -> Result<Tensor> {
        data.vectors
            .index_select(&Tensor::from_slice(rows, rows.len(), device)?, 0)
    };
    let validation_x = rows_of(&data.validation)?;
    let validation_truth: Vec<u32> = data
        .validation
        .iter()
        .map(|r| data.labels[*r as usize])
        .collect();
    let mut metrics_out = Vec::new();
    for epoch in request.start_epoch + 1..=request.end_epoch {
        let mut order = data.train.clone();
        let mut rng = SeededRng::derived(request.trial_seed, u64::from(epoch));
        rng.shuffle(&mut order);
        for batch in order.chunks(params.batch_size.max(1)) {
            let logits = model.forward(&rows_of(batch)?, Some(&mut rng))?;
            let loss = candle_nn::loss::cross_entropy(&logits, &labels(batch)?)?;
            optimizer.step(&loss.backward()?)?;
        }
        let predicted: Vec<u32> = model.forward(&validation_x, None)?.argmax(1)?.to_vec1()?;
        metrics_out.push(match request.metric.as_str() {
            "macro_f1" => metrics::macro_f1(&predicted, &validation_truth, data.classes),
            _ => metrics::accuracy(&predicted, &validation_truth),
        });
    }
    Ok((metrics_out, optimizer.checkpoint(request.end_epoch)?))
}
