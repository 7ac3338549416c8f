//! The per-GPU gauges both `/metrics` pages show, the agent's (`resident_agent_gpu_*`, its
//! own GPUs) and the scheduler's (`resident_gpu_*`, every alive node's): one definition of
//! the families, their labels (`node`, `gpu`, `name`) and value types, filled from the
//! [`pb::GpuInfo`] a heartbeat carries. Behind the `metrics` feature (prometheus-client).

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::pb;

/// A GPU's labels: its node, its index on the node and its model name.
type GpuLabels = [(&'static str, String); 3];

/// The per-GPU gauge families, registered under one name prefix.
pub struct GpuGauges {
    vram_total: Family<GpuLabels, Gauge>,
    vram_free: Family<GpuLabels, Gauge>,
    utilization: Family<GpuLabels, Gauge<f64, AtomicU64>>,
}

impl GpuGauges {
    /// Registers `{prefix}_vram_total_bytes`, `{prefix}_vram_free_bytes` and
    /// `{prefix}_utilization_ratio` in `registry` (`prefix`: `resident_gpu` on the
    /// scheduler, `resident_agent_gpu` on an agent).
    pub fn register(registry: &mut Registry, prefix: &str) -> Self {
        let gauges = Self {
            vram_total: Family::default(),
            vram_free: Family::default(),
            utilization: Family::default(),
        };
        registry.register(
            format!("{prefix}_vram_total_bytes"),
            "Each GPU's memory",
            gauges.vram_total.clone(),
        );
        registry.register(
            format!("{prefix}_vram_free_bytes"),
            "Each GPU's free memory, as its agent last read it",
            gauges.vram_free.clone(),
        );
        registry.register(
            format!("{prefix}_utilization_ratio"),
            "Each GPU's busy fraction (NVML), where the agent can read it",
            gauges.utilization.clone(),
        );
        gauges
    }

    /// Sets the gauges of one GPU of `node_id` (utilisation only where it was read).
    pub fn observe(&self, node_id: &str, gpu: &pb::GpuInfo) {
        let labels: GpuLabels = [
            ("node", node_id.to_owned()),
            ("gpu", gpu.index.to_string()),
            ("name", gpu.name.clone()),
        ];
        let bytes = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        self.vram_total
            .get_or_create(&labels)
            .set(bytes(gpu.total_vram_bytes));
        self.vram_free
            .get_or_create(&labels)
            .set(bytes(gpu.free_vram_bytes));
        if let Some(ratio) = gpu.utilization_ratio {
            self.utilization.get_or_create(&labels).set(ratio);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gpu_reads_as_three_labelled_gauges_and_no_utilisation_when_unread() {
        let mut registry = Registry::default();
        let gauges = GpuGauges::register(&mut registry, "resident_gpu");
        let gpu = |index, utilization_ratio| pb::GpuInfo {
            index,
            name: "NVIDIA A10G".into(),
            total_vram_bytes: 24 << 30,
            free_vram_bytes: 20 << 30,
            utilization_ratio,
            ..Default::default()
        };
        gauges.observe("n1", &gpu(0, Some(0.75)));
        gauges.observe("n1", &gpu(1, None));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        for expected in [
            "resident_gpu_vram_total_bytes{node=\"n1\",gpu=\"0\",name=\"NVIDIA A10G\"} 25769803776",
            "resident_gpu_vram_free_bytes{node=\"n1\",gpu=\"1\",name=\"NVIDIA A10G\"} 21474836480",
            "resident_gpu_utilization_ratio{node=\"n1\",gpu=\"0\",name=\"NVIDIA A10G\"} 0.75",
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        assert!(
            !text.contains("utilization_ratio{node=\"n1\",gpu=\"1\""),
            "{text}"
        );
    }
}
