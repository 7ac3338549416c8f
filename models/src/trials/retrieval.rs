//! The `retrieval` trial: queries ranked against every document by cosine similarity,
//! optionally through a linear query adapter trained with an in-batch contrastive (InfoNCE)
//! loss; metrics recall@10 and nDCG@10 on held-out queries.

use candle_core::{D, DType, Result, Tensor, Var};
use resident_proto::{SeededRng, pb};
use serde::Deserialize;

use super::classifier::{default_batch, default_lr};
use super::dataset::LoadedDataset;
use super::metrics;
use super::optim::AdamW;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalParams {
    #[serde(default = "default_lr")]
    pub lr: f64,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Train a query adapter (else: rank with the raw embeddings).
    #[serde(default = "yes")]
    pub adapter: bool,
    #[serde(default)]
    pub epochs: Option<u32>,
}

fn default_temperature() -> f64 {
    0.05
}

fn yes() -> bool {
    true
}

fn normalize(x: &Tensor) -> Result<Tensor> {
    x.broadcast_div(
        &x.sqr()?
            .sum_keepdim(D::Minus1)?
            .sqrt()?
            .affine(1.0, 1e-12)?,
    )
}

/// The 0-based rank of each query's document among all documents.
fn ranks(adapted: &Tensor, documents: &Tensor, gold_rows: &[u32]) -> Result<Vec<u32>> {
    let device = documents.device();
    let gold =
        documents.index_select(&Tensor::from_slice(gold_rows, gold_rows.len(), device)?, 0)?;
    let gold_scores = (adapted * gold)?.sum_keepdim(1)?;
    let scores = adapted.matmul(&documents.t()?)?;
    let better = scores
        .broadcast_gt(&gold_scores)?
        .to_dtype(DType::F32)?
        .sum(1)?;
    Ok(better
        .to_vec1::<f32>()?
        .into_iter()
        .map(|r| r as u32)
        .collect())
}

pub fn train(
    data: &LoadedDataset,
    params: &RetrievalParams,
    request: &pb::TrialRequest,
) -> Result<(Vec<f64>, pb::TrialCheckpoint)> {
    let queries = data
        .queries
        .as_ref()
        .ok_or_else(|| candle_core::Error::Msg("the dataset has no queries".into()))?;
    let device = queries.device();
    let adapter = Var::from_tensor(&Tensor::eye(data.dim, DType::F32, device)?)?;
    let mut optimizer = AdamW::new(
        vec![("adapter".into(), adapter.clone())],
        params.lr,
        params.weight_decay,
        request.checkpoint.as_ref(),
    )?;
    let select = |t: &Tensor, rows: &[u32]| -> Result<Tensor> {
        t.index_select(&Tensor::from_slice(rows, rows.len(), device)?, 0)
    };
    let docs_of =
        |rows: &[u32]| -> Vec<u32> { rows.iter().map(|q| data.query_docs[*q as usize]).collect() };
    let temperature = params.temperature.max(1e-4);
    let mut metrics_out = Vec::new();
    for epoch in request.start_epoch + 1..=request.end_epoch {
        if params.adapter {
            let mut order = data.train.clone();
            SeededRng::derived(request.trial_seed, u64::from(epoch)).shuffle(&mut order);
            for batch in order.chunks(params.batch_size.max(2)) {
                let q = normalize(&select(queries, batch)?.matmul(adapter.as_tensor())?)?;
                let d = select(&data.vectors, &docs_of(batch))?;
                let logits = q.matmul(&d.t()?)?.affine(1.0 / temperature, 0.0)?;
                let targets = Tensor::arange(0u32, batch.len() as u32, device)?;
                let loss = candle_nn::loss::cross_entropy(&logits, &targets)?;
                optimizer.step(&loss.backward()?)?;
            }
        }
        let mut all_ranks = Vec::with_capacity(data.validation.len());
        for block in data.validation.chunks(256) {
            let q = normalize(&select(queries, block)?.matmul(adapter.as_tensor())?)?;
            all_ranks.extend(ranks(&q, &data.vectors, &docs_of(block))?);
        }
        metrics_out.push(match request.metric.as_str() {
            "ndcg@10" => metrics::ndcg_at_10(&all_ranks),
            _ => metrics::recall_at_10(&all_ranks),
        });
    }
    Ok((metrics_out, optimizer.checkpoint(request.end_epoch)?))
}
