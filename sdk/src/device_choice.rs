//! Where a job's actors run when the user did not say: on the GPUs when the nodes the job
//! may use have any, one actor per GPU; on CPU cores otherwise. Pure, so that the corpus
//! jobs, `Cluster::embed`-style calls and the Python package choose alike and say why.

use std::collections::BTreeMap;

use crate::{Cluster, NodeInfo, SdkError};

/// One actor per GPU: measured on an H200 (BENCHMARKS.md), one MiniLM actor on the whole
/// GPU embedded 56,977 docs/s, four at 0.25 each 47,000-51,000; a bigger model only gains
/// from the whole GPU.
pub const DEFAULT_GPUS_PER_ACTOR: f64 = 1.0;

/// The device a job's actors get, and the sentence that says why.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceChoice {
    /// GPUs per actor; 0 for CPU actors.
    pub gpus_per_actor: f64,
    /// For the job's one-line summary, e.g. "one actor per GPU (8 GPUs on 2 nodes; ...)".
    pub why: String,
}

/// Chooses `requested` when given, else the GPUs of the alive nodes that match `selector`:
/// one actor per GPU, or, when the caller asked for more `replicas` than there are GPUs, an
/// equal share of a GPU each (3 actors on 2 GPUs: half a GPU each), so that all of them
/// place. `knob` names the setting in the caller's words (`--gpus-per-actor`,
/// `gpus_per_actor=`), so that the sentence tells the user how to choose otherwise.
pub fn choose_device(
    requested: Option<f64>,
    replicas: Option<u32>,
    nodes: &[NodeInfo],
    selector: &BTreeMap<String, String>,
    knob: &str,
) -> DeviceChoice {
    let matching: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| n.alive && selector.iter().all(|(k, v)| n.labels.get(k) == Some(v)))
        .collect();
    let gpus: usize = matching.iter().map(|n| n.gpus.len()).sum();
    let gpu_nodes = matching.iter().filter(|n| !n.gpus.is_empty()).count();
    let cpu_only_nodes = matching.len() - gpu_nodes;
    let on = |count: usize, what: &str| format!("{count} {what}{}", plural(count));
    match requested {
        Some(g) if g > 0.0 => DeviceChoice {
            gpus_per_actor: g,
            why: format!("{g} GPU per actor, as asked ({knob} {g})"),
        },
        Some(_) if gpus > 0 => DeviceChoice {
            gpus_per_actor: 0.0,
            why: format!(
                "CPU actors, as asked ({knob} 0), leaving {} idle",
                on(gpus, "GPU")
            ),
        },
        Some(_) => DeviceChoice {
            gpus_per_actor: 0.0,
            why: format!("CPU actors, as asked ({knob} 0)"),
        },
        None if gpus > 0 => {
            let unused = match cpu_only_nodes {
                0 => String::new(),
                n => format!("; {} without GPUs unused", on(n, "node")),
            };
            let found = format!("{} on {}{unused}", on(gpus, "GPU"), on(gpu_nodes, "node"));
            let sharing = replicas
                .filter(|&r| r as usize > gpus)
                .map(|r| (r as usize).div_ceil(gpus));
            match sharing {
                None => DeviceChoice {
                    gpus_per_actor: DEFAULT_GPUS_PER_ACTOR,
                    why: format!("one actor per GPU ({found}); {knob} 0 runs CPU actors instead"),
                },
                Some(per_gpu) => DeviceChoice {
                    gpus_per_actor: 1.0 / per_gpu as f64,
                    why: format!(
                        "{} actors sharing the GPUs, {per_gpu} to a GPU ({found}); {knob} 0 runs \
                         CPU actors instead",
                        replicas.unwrap_or_default()
                    ),
                },
            }
        }
        None => DeviceChoice {
            gpus_per_actor: 0.0,
            why: "CPU actors: no GPUs on the nodes this job may use".to_owned(),
        },
    }
}

/// How many actors a job runs when it was not told: on GPUs, as many as the GPUs of the
/// matching nodes hold at `gpus_per_actor` each, counted node by node (an actor's GPUs are
/// on one node); on CPUs, `cpu_actors_per_node(cores)` on each matching node (embedding: one
/// per core, each actor runs on one thread; generation: one per node, a step uses every
/// core). Matching nodes are alive, not draining and carry every label of `selector`. At
/// least one, so that a job on a cluster with no room yet waits for one rather than failing.
pub fn default_replicas(
    nodes: &[NodeInfo],
    selector: &BTreeMap<String, String>,
    gpus_per_actor: f64,
    cpu_actors_per_node: impl Fn(u32) -> u32,
) -> u32 {
    let matching = nodes.iter().filter(|n| {
        n.alive && !n.draining && selector.iter().all(|(k, v)| n.labels.get(k) == Some(v))
    });
    let count: u32 = if gpus_per_actor > 0.0 {
        matching
            .map(|n| (n.gpus.len() as f64 / gpus_per_actor).floor() as u32)
            .sum()
    } else {
        matching
            .map(|n| cpu_actors_per_node(n.cpu_cores.max(1)))
            .sum()
    };
    count.max(1)
}

impl Cluster {
    /// [`default_replicas`] over this cluster's nodes as they are now.
    pub async fn default_replicas(
        &self,
        selector: &BTreeMap<String, String>,
        gpus_per_actor: f64,
        cpu_actors_per_node: impl Fn(u32) -> u32,
    ) -> Result<u32, SdkError> {
        let nodes = self.list_nodes().await?;
        Ok(default_replicas(
            &nodes,
            selector,
            gpus_per_actor,
            cpu_actors_per_node,
        ))
    }

    /// [`choose_device`] over this cluster's nodes as they are now: what a job that names no
    /// device would run on (`gpus_per_actor` for [`crate::EmbedPoolSpec::gpus`] and
    /// [`crate::PoolSpec::gpus`]), and why.
    pub async fn choose_device(
        &self,
        requested: Option<f64>,
        replicas: Option<u32>,
        selector: &BTreeMap<String, String>,
        knob: &str,
    ) -> Result<DeviceChoice, SdkError> {
        let nodes = self.list_nodes().await?;
        Ok(choose_device(requested, replicas, &nodes, selector, knob))
    }
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GpuInfo, NodeId};

    fn node(id: &str, gpus: usize, labels: &[(&str, &str)]) -> NodeInfo {
        NodeInfo {
            unavailable_gpus: Vec::new(),
            node_id: NodeId::from(id),
            generation: "g".into(),
            hostname: id.into(),
            alive: true,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            gpus: (0..gpus)
                .map(|i| GpuInfo {
                    index: i as u32,
                    uuid: format!("GPU-{id}-{i}"),
                    name: "NVIDIA A10G".into(),
                    total_vram_bytes: 24 << 30,
                    free_vram_bytes: 24 << 30,
                    compute_capability: (8, 6),
                    simulated: false,
                })
                .collect(),
            cpu_cores: 8,
            ram_bytes: 1 << 34,
            last_heartbeat_ms_ago: 0,
            credential: "anonymous".into(),
            draining: false,
        }
    }

    const KNOB: &str = "--gpus-per-actor";

    #[test]
    fn default_replicas_fill_each_node_and_skip_what_may_not_take_actors() {
        let mut draining = node("c", 8, &[]);
        draining.draining = true;
        let mut dead = node("d", 8, &[]);
        dead.alive = false;
        let nodes = [
            node("a", 3, &[("zone", "x")]),
            node("b", 3, &[]),
            draining,
            dead,
        ];
        let any = BTreeMap::new();
        // Per node: 3 GPUs at 2 each hold one actor, not 6 / 2 = 3 over the two nodes.
        assert_eq!(default_replicas(&nodes, &any, 2.0, |cores| cores), 2);
        assert_eq!(default_replicas(&nodes, &any, 0.5, |cores| cores), 12);
        // CPU: the work says how many per node (one per core, or one per node).
        assert_eq!(default_replicas(&nodes, &any, 0.0, |cores| cores), 16);
        assert_eq!(default_replicas(&nodes, &any, 0.0, |_| 1), 2);
        let zone_x = BTreeMap::from([("zone".to_owned(), "x".to_owned())]);
        assert_eq!(default_replicas(&nodes, &zone_x, 1.0, |cores| cores), 3);
        // Nothing matches: one actor, which waits for a node.
        let zone_y = BTreeMap::from([("zone".to_owned(), "y".to_owned())]);
        assert_eq!(default_replicas(&nodes, &zone_y, 1.0, |cores| cores), 1);
    }

    #[test]
    fn gpus_are_used_by_default_one_actor_each() {
        let nodes = [node("a", 4, &[]), node("b", 4, &[])];
        let choice = choose_device(None, None, &nodes, &BTreeMap::new(), KNOB);
        assert_eq!(choice.gpus_per_actor, 1.0);
        assert_eq!(
            choice.why,
            "one actor per GPU (8 GPUs on 2 nodes); --gpus-per-actor 0 runs CPU actors instead"
        );
    }

    #[test]
    fn without_gpus_the_actors_run_on_cpus() {
        let nodes = [node("a", 0, &[])];
        let choice = choose_device(None, None, &nodes, &BTreeMap::new(), KNOB);
        assert_eq!(choice.gpus_per_actor, 0.0);
        assert!(
            choice.why.starts_with("CPU actors: no GPUs"),
            "{}",
            choice.why
        );
    }

    #[test]
    fn an_explicit_zero_keeps_the_cpu_and_says_what_idles() {
        let nodes = [node("a", 1, &[])];
        let choice = choose_device(Some(0.0), None, &nodes, &BTreeMap::new(), "gpus_per_actor=");
        assert_eq!(choice.gpus_per_actor, 0.0);
        assert_eq!(
            choice.why,
            "CPU actors, as asked (gpus_per_actor= 0), leaving 1 GPU idle"
        );
    }

    #[test]
    fn an_explicit_fraction_is_kept() {
        let nodes = [node("a", 1, &[])];
        let choice = choose_device(Some(0.25), None, &nodes, &BTreeMap::new(), KNOB);
        assert_eq!(choice.gpus_per_actor, 0.25);
    }

    #[test]
    fn more_replicas_than_gpus_share_them_equally() {
        let nodes = [node("a", 2, &[])];
        let choice = choose_device(None, Some(3), &nodes, &BTreeMap::new(), KNOB);
        assert_eq!(choice.gpus_per_actor, 0.5);
        assert_eq!(
            choice.why,
            "3 actors sharing the GPUs, 2 to a GPU (2 GPUs on 1 node); --gpus-per-actor 0 runs \
             CPU actors instead"
        );
        let choice = choose_device(None, Some(4), &[node("a", 1, &[])], &BTreeMap::new(), KNOB);
        assert_eq!(choice.gpus_per_actor, 0.25);
        let choice = choose_device(None, Some(2), &nodes, &BTreeMap::new(), KNOB);
        assert_eq!(
            choice.gpus_per_actor, 1.0,
            "as many replicas as GPUs: one each"
        );
    }

    #[test]
    fn only_matching_alive_nodes_count() {
        let mut dead = node("dead", 8, &[("pool", "gpu")]);
        dead.alive = false;
        let nodes = [
            dead,
            node("cpu", 0, &[("pool", "gpu")]),
            node("other", 8, &[("pool", "batch")]),
        ];
        let selector = BTreeMap::from([("pool".to_owned(), "gpu".to_owned())]);
        let choice = choose_device(None, None, &nodes, &selector, KNOB);
        assert_eq!(choice.gpus_per_actor, 0.0, "{}", choice.why);

        let nodes = [
            node("gpu", 2, &[("pool", "gpu")]),
            node("cpu", 0, &[("pool", "gpu")]),
        ];
        let choice = choose_device(None, None, &nodes, &selector, KNOB);
        assert_eq!(choice.gpus_per_actor, 1.0);
        assert!(
            choice.why.contains("1 node without GPUs unused"),
            "{}",
            choice.why
        );
    }
}
