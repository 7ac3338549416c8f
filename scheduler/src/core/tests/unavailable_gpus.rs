//! A node whose agent could not open one of its GPUs: the GPU is listed as unavailable, with
//! the driver's reason, and every actor goes to the GPUs it offers, under their own indices.

use super::*;

#[tokio::test(start_paused = true)]
async fn an_unavailable_gpu_is_listed_with_its_reason_and_actors_go_to_the_others() {
    let mut h = Harness::new(CoreConfig::for_test());
    let register = pb::RegisterNode {
        node_id: "g1".into(),
        generation: "g1-gen".into(),
        cpu_cores: 4,
        gpus: vec![gpu(1, 24)],
        unavailable_gpus: vec![pb::UnavailableGpu {
            index: 0,
            reason: "busy or unavailable (CUDA_ERROR_DEVICE_UNAVAILABLE)".into(),
        }],
        actor_kinds: vec!["echo".into()],
        ..Default::default()
    };
    h.register(register, Principal::ANONYMOUS).unwrap();
    let node = h.core.node_infos().pop().expect("the node");
    assert_eq!(node.gpus.len(), 1);
    assert_eq!(node.unavailable_gpus.len(), 1);
    assert_eq!(node.unavailable_gpus[0].index, 0);
    assert!(
        node.unavailable_gpus[0]
            .reason
            .contains("DEVICE_UNAVAILABLE")
    );

    let mut spec = gpu_pool("p", 8);
    spec.replicas = 2;
    h.create_pool(spec);
    h.tick();
    let started: Vec<Vec<u32>> = sent(h.agent("g1"))
        .into_iter()
        .filter_map(|message| match message {
            pb::scheduler_message::Body::StartActor(start) => Some(start.gpu_indices),
            _ => None,
        })
        .collect();
    assert_eq!(
        started,
        [vec![1], vec![1]],
        "two half-GPU actors, both on GPU 1"
    );
}

#[test]
fn a_registration_with_too_many_or_too_wordy_unavailable_gpus_is_refused() {
    use crate::policy::field_limits::{MAX_GPU_REASON_BYTES, MAX_GPUS, check_registration};
    let unavailable = |count: usize, reason_bytes: usize| pb::RegisterNode {
        node_id: "g1".into(),
        unavailable_gpus: vec![
            pb::UnavailableGpu {
                index: 0,
                reason: "x".repeat(reason_bytes),
            };
            count
        ],
        ..Default::default()
    };
    assert!(check_registration(&unavailable(MAX_GPUS, MAX_GPU_REASON_BYTES)).is_ok());
    let many = check_registration(&unavailable(MAX_GPUS + 1, 8)).unwrap_err();
    assert!(many.to_string().contains("unavailable_gpus"), "{many}");
    let wordy = check_registration(&unavailable(1, MAX_GPU_REASON_BYTES + 1)).unwrap_err();
    assert!(
        wordy.to_string().contains("why a GPU is unavailable"),
        "{wordy}"
    );
}
