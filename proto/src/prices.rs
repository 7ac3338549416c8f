//! What compute costs: USD per GPU-hour by node pool label or GPU model, per CPU core-hour.
//! The scheduler charges running jobs with it (the dashboard's cost so far), `resident embed`
//! and `resident generate` price their report with it and `resident sweep` its summary.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Price per hour of one GPU by pool label value, with public on-demand defaults by GPU model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PriceTable {
    /// `pool` label value -> USD per GPU-hour (overrides the model defaults).
    pub per_pool_label: BTreeMap<String, f64>,
    /// GPU name fragment -> USD per GPU-hour.
    pub per_gpu_model: BTreeMap<String, f64>,
    /// USD per CPU core-hour, for CPU-only actors.
    pub per_cpu_core: f64,
}

impl Default for PriceTable {
    /// AWS on-demand us-east-1 prices per GPU (instance price / GPUs): T4 g4dn.xlarge 0.526,
    /// A10G g5.xlarge 1.006, L4 g6.xlarge 0.805, V100 p3.2xlarge 3.06, A100 p4d.24xlarge/8
    /// 4.10, H100 p5.48xlarge/8 12.29; RTX A6000 at a typical cloud rate of 0.80; a CPU core
    /// at half a c6i.large (0.085/2).
    fn default() -> Self {
        let per_gpu_model = [
            ("T4", 0.526),
            ("A10G", 1.006),
            ("L4", 0.805),
            ("V100", 3.06),
            ("A100", 4.10),
            ("H100", 12.29),
            ("A6000", 0.80),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        Self {
            per_pool_label: BTreeMap::new(),
            per_gpu_model,
            per_cpu_core: 0.0425,
        }
    }
}

impl PriceTable {
    /// USD per hour of one GPU: the node's `pool` label's price, else the longest GPU
    /// model name found in `gpu_name`, else 1.0.
    pub fn gpu_hour(&self, pool_label: Option<&String>, gpu_name: &str) -> f64 {
        if let Some(price) = pool_label.and_then(|l| self.per_pool_label.get(l)) {
            return *price;
        }
        let upper = gpu_name.to_ascii_uppercase();
        self.per_gpu_model
            .iter()
            .filter(|(model, _)| upper.contains(&model.to_ascii_uppercase()))
            .max_by_key(|(model, _)| model.len())
            .map_or(1.0, |(_, price)| *price)
    }
}
