//! Sweep trials on `embed` actors: train a small head on the sweep's embeddings, which the
//! actor loads once (from the runner's cache file) and keeps next to its model.

mod classifier;
mod dataset;
mod metrics;
mod optim;
mod retrieval;

use std::time::Instant;

use candle_core::Device;
use resident_proto::pb;

use crate::ModelError;
use crate::roots::FileRoots;
use dataset::LoadedDataset;

/// The dataset an actor holds (one at a time: a sweep's).
#[derive(Default)]
pub struct TrialRunner {
    cached: Option<LoadedDataset>,
}

/// A trial never trains past its own `epochs` hyperparameter (the runner caps it too).
fn check_epoch_cap(cap: Option<u32>, request: &pb::TrialRequest) -> Result<(), ModelError> {
    match cap {
        Some(cap) if request.end_epoch > cap => Err(ModelError::BadPayload(format!(
            "epoch {} is beyond the trial's epochs = {cap}",
            request.end_epoch
        ))),
        _ => Ok(()),
    }
}

fn parse<T: serde::de::DeserializeOwned>(json: &str, kind: &str) -> Result<T, ModelError> {
    serde_json::from_str(if json.is_empty() { "{}" } else { json })
        .map_err(|e| ModelError::BadPayload(format!("{kind} trial parameters: {e}")))
}

impl TrialRunner {
    /// Runs one trial segment (a few epochs) and returns its metrics and checkpoint.
    pub fn run(
        &mut self,
        request: &pb::TrialRequest,
        device: &Device,
        roots: &FileRoots,
    ) -> Result<pb::TrialResponse, ModelError> {
        if request.end_epoch <= request.start_epoch {
            return Err(ModelError::BadPayload(format!(
                "trial epochs ({}, {}] are empty",
                request.start_epoch, request.end_epoch
            )));
        }
        let load_started = Instant::now();
        let hit = self
            .cached
            .as_ref()
            .is_some_and(|d| d.key == request.dataset_key && d.split_seed == request.split_seed);
        if !hit {
            self.cached = None; // free the old one first
            self.cached = Some(LoadedDataset::load(
                &request.dataset_uri,
                &request.dataset_key,
                request.split_seed,
                device,
                roots,
            )?);
        }
        let dataset_load_micros = if hit {
            0
        } else {
            load_started.elapsed().as_micros() as u64
        };
        let data = self.cached.as_ref().expect("loaded above");
        let started = Instant::now();
        let trained = match request.kind.as_str() {
            "classifier" => {
                if data.queries.is_some() {
                    return Err(ModelError::BadPayload(
                        "a classifier trial needs a labelled dataset".into(),
                    ));
                }
                let params: classifier::ClassifierParams =
                    parse(&request.params_json, "classifier")?;
                check_epoch_cap(params.epochs, request)?;
                classifier::train(data, &params, request)
            }
            "retrieval" => {
                let params: retrieval::RetrievalParams = parse(&request.params_json, "retrieval")?;
                check_epoch_cap(params.epochs, request)?;
                retrieval::train(data, &params, request)
            }
            other => {
                return Err(ModelError::BadPayload(format!(
                    "unknown trial kind `{other}` (classifier, retrieval)"
                )));
            }
        };
        let (metrics, checkpoint) =
            trained.map_err(|e| ModelError::Task(format!("training failed: {e}")))?;
        Ok(pb::TrialResponse {
            metrics,
            checkpoint: Some(checkpoint),
            train_micros: started.elapsed().as_micros() as u64,
            dataset_load_micros,
            device: format!("{device:?}"),
            train_size: data.train.len() as u32,
            validation_size: data.validation.len() as u32,
        })
    }
}
