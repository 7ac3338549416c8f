//! AdamW over candle `Var`s, with its state in a checkpoint so a trial can stop after one
//! epoch and go on later on another actor exactly where it was.

use candle_core::backprop::GradStore;
use candle_core::{Device, Result, Tensor, Var};
use resident_proto::pb;

struct Param {
    name: String,
    var: Var,
    m: Tensor,
    v: Tensor,
}

pub struct AdamW {
    lr: f64,
    weight_decay: f64,
    step: u64,
    params: Vec<Param>,
}

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;

fn to_proto(name: &str, tensor: &Tensor) -> Result<pb::NamedTensor> {
    let data: Vec<f32> = tensor.flatten_all()?.to_vec1()?;
    Ok(pb::NamedTensor {
        name: name.to_owned(),
        shape: tensor.dims().iter().map(|d| *d as u32).collect(),
        data: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
    })
}

fn from_proto(tensor: &pb::NamedTensor, device: &Device) -> Result<Tensor> {
    let values: Vec<f32> = tensor
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let shape: Vec<usize> = tensor.shape.iter().map(|d| *d as usize).collect();
    Tensor::from_vec(values, shape, device)
}

impl AdamW {
    /// Named parameters, with their moments restored from `checkpoint` when it has them.
    pub fn new(
        params: Vec<(String, Var)>,
        lr: f64,
        weight_decay: f64,
        checkpoint: Option<&pb::TrialCheckpoint>,
    ) -> Result<Self> {
        let saved = |name: &str| checkpoint.and_then(|c| c.tensors.iter().find(|t| t.name == name));
        let mut out = Vec::with_capacity(params.len());
        for (name, var) in params {
            let device = var.device().clone();
            if let Some(weights) = saved(&name) {
                var.set(&from_proto(weights, &device)?)?;
            }
            let moment = |suffix: &str| match saved(&format!("{name}.{suffix}")) {
                Some(t) => from_proto(t, &device),
                None => var.zeros_like(),
            };
            let (m, v) = (moment("m")?, moment("v")?);
            out.push(Param { name, var, m, v });
        }
        Ok(Self {
            lr,
            weight_decay,
            step: checkpoint.map_or(0, |c| c.step),
            params: out,
        })
    }

    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step += 1;
        let correction1 = 1.0 - BETA1.powi(self.step as i32);
        let correction2 = 1.0 - BETA2.powi(self.step as i32);
        for param in &mut self.params {
            let Some(grad) = grads.get(param.var.as_tensor()) else {
                continue;
            };
            param.m = (param.m.affine(BETA1, 0.0)? + grad.affine(1.0 - BETA1, 0.0)?)?;
            param.v = (param.v.affine(BETA2, 0.0)? + grad.sqr()?.affine(1.0 - BETA2, 0.0)?)?;
            let denominator = param
                .v
                .affine(1.0 / correction2, 0.0)?
                .sqrt()?
                .affine(1.0, EPS)?;
            let update = param.m.affine(1.0 / correction1, 0.0)?.div(&denominator)?;
            let decayed = param
                .var
                .as_tensor()
                .affine(1.0 - self.lr * self.weight_decay, 0.0)?;
            param.var.set(&(decayed - update.affine(self.lr, 0.0)?)?)?;
        }
        Ok(())
    }

    pub fn checkpoint(&self, epoch: u32) -> Result<pb::TrialCheckpoint> {
        let mut tensors = Vec::with_capacity(self.params.len() * 3);
        for param in &self.params {
            tensors.push(to_proto(&param.name, param.var.as_tensor())?);
            tensors.push(to_proto(&format!("{}.m", param.name), &param.m)?);
            tensors.push(to_proto(&format!("{}.v", param.name), &param.v)?);
        }
        Ok(pb::TrialCheckpoint {
            epoch,
            step: self.step,
            tensors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimises_a_quadratic_and_resumes_from_a_checkpoint() -> Result<()> {
        let device = Device::Cpu;
        let target = Tensor::new(&[3f32, -2.0], &device)?;
        let run = |steps: usize, from: Option<&pb::TrialCheckpoint>| -> Result<AdamW> {
            let x = Var::zeros(2, candle_core::DType::F32, &device)?;
            let mut opt = AdamW::new(vec![("x".into(), x.clone())], 0.1, 0.0, from)?;
            for _ in 0..steps {
                let loss = (x.as_tensor() - &target)?.sqr()?.sum_all()?;
                opt.step(&loss.backward()?)?;
            }
            Ok(opt)
        };
        let straight = run(300, None)?.checkpoint(2)?;
        let half = run(150, None)?.checkpoint(1)?;
        let resumed = run(150, Some(&half))?.checkpoint(2)?;
        assert_eq!(straight, resumed, "two halves equal one run");
        let x = from_proto(&straight.tensors[0], &device)?.to_vec1::<f32>()?;
        assert!(
            (x[0] - 3.0).abs() < 0.05 && (x[1] + 2.0).abs() < 0.05,
            "{x:?}"
        );
        Ok(())
    }
}
