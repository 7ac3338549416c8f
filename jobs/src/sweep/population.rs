//! PBT's population on disk: after every round, each trial still training is written to
//! the output (`population.json` and one checkpoint file per trial under `population/`), so
//! that a sweep killed between rounds resumes from its last round instead of epoch 0 (the
//! population's copies cannot be replayed from `results.jsonl`, which only holds trials
//! that ended).
//!
//! A round's checkpoint files have names of their own (trial and epoch); `population.json`
//! is replaced after they are all on disk and names them; the previous round's files go
//! after. A kill at any point leaves either the previous round or this one, whole.

use std::path::{Path, PathBuf};

use prost::Message;
use resident_proto::pb;
use serde::{Deserialize, Serialize};

use super::SweepError;
use super::pbt::Perturbation;
use super::search::Params;
use crate::files::write_atomically;

/// One trial of the population as a round left it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    /// The trial.
    pub trial_id: usize,
    /// The hyperparameters it trains on with.
    pub params: Params,
    /// Its metric after each epoch so far.
    pub metrics: Vec<f64>,
    /// What it started with and each copy it made.
    pub schedule: Vec<Perturbation>,
    /// Seconds actors spent training it so far.
    pub train_s: f64,
    /// Its checkpoint's file, under the output.
    pub checkpoint: String,
}

/// The population after a round.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PopulationFile {
    /// The round's epoch.
    epoch: u32,
    members: Vec<Member>,
}

/// The population an earlier run's last round left: its epoch, each member and its
/// checkpoint.
pub struct SavedPopulation {
    /// The round's epoch.
    pub epoch: u32,
    /// The members, each with its checkpoint.
    pub members: Vec<(Member, pb::TrialCheckpoint)>,
}

fn output_error(path: &Path, e: impl std::fmt::Display) -> SweepError {
    SweepError::Output(format!("{}: {e}", path.display()))
}

/// Writes the population after the round at `epoch`: each member with its checkpoint.
/// Blocking (call it off the runtime's threads).
pub fn save_population(
    output: &Path,
    epoch: u32,
    members: Vec<(Member, pb::TrialCheckpoint)>,
) -> Result<(), SweepError> {
    let dir = output.join("population");
    std::fs::create_dir_all(&dir).map_err(|e| output_error(&dir, e))?;
    let mut listed = Vec::with_capacity(members.len());
    for (mut member, checkpoint) in members {
        let name = format!("trial-{}-epoch-{epoch}.checkpoint", member.trial_id);
        let path = dir.join(&name);
        write_atomically(&path, &checkpoint.encode_to_vec()).map_err(|e| output_error(&path, e))?;
        member.checkpoint = format!("population/{name}");
        listed.push(member);
    }
    let file = PopulationFile {
        epoch,
        members: listed,
    };
    let path = output.join("population.json");
    let bytes = serde_json::to_vec_pretty(&file).map_err(|e| output_error(&path, e))?;
    write_atomically(&path, &bytes).map_err(|e| output_error(&path, e))?;
    let kept: Vec<PathBuf> = file
        .members
        .iter()
        .map(|m| output.join(&m.checkpoint))
        .collect();
    for entry in std::fs::read_dir(&dir).map_err(|e| output_error(&dir, e))? {
        let path = entry.map_err(|e| output_error(&dir, e))?.path();
        if !kept.contains(&path) {
            let _ = std::fs::remove_file(&path); // an earlier round's: only space is lost
        }
    }
    Ok(())
}

/// The population an earlier run saved, if it left one that reads back whole; `None`
/// otherwise (a sweep killed before its first round starts over). Blocking.
pub fn load_population(output: &Path) -> Option<SavedPopulation> {
    let path = output.join("population.json");
    let bytes = std::fs::read(&path).ok()?;
    let file: PopulationFile = match serde_json::from_slice(&bytes) {
        Ok(file) => file,
        Err(error) => {
            tracing::warn!(%error, path = %path.display(), "the saved population does not parse; PBT starts over");
            return None;
        }
    };
    let mut members = Vec::with_capacity(file.members.len());
    for member in file.members {
        let path = output.join(&member.checkpoint);
        let checkpoint = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| pb::TrialCheckpoint::decode(b.as_slice()).map_err(|e| e.to_string()));
        match checkpoint {
            Ok(checkpoint) => members.push((member, checkpoint)),
            Err(error) => {
                tracing::warn!(%error, path = %path.display(), "a saved checkpoint does not read; PBT starts over");
                return None;
            }
        }
    }
    Some(SavedPopulation {
        epoch: file.epoch,
        members,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(trial_id: usize, epoch: u32) -> (Member, pb::TrialCheckpoint) {
        let member = Member {
            trial_id,
            params: Params::from([("lr".to_owned(), serde_json::json!(0.01))]),
            metrics: vec![0.5; epoch as usize],
            schedule: Vec::new(),
            train_s: 1.5,
            checkpoint: String::new(),
        };
        let checkpoint = pb::TrialCheckpoint {
            epoch,
            step: 10 * u64::from(epoch) + trial_id as u64,
            tensors: Vec::new(),
        };
        (member, checkpoint)
    }

    #[test]
    fn a_saved_round_reads_back_whole_and_replaces_the_one_before() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load_population(dir.path()).is_none(), "none saved yet");
        save_population(dir.path(), 2, vec![member(0, 2), member(3, 2)]).unwrap();
        save_population(dir.path(), 4, vec![member(0, 4), member(3, 4)]).unwrap();
        let saved = load_population(dir.path()).unwrap();
        assert_eq!(saved.epoch, 4);
        let steps: Vec<(usize, u64)> = saved
            .members
            .iter()
            .map(|(m, c)| (m.trial_id, c.step))
            .collect();
        assert_eq!(steps, vec![(0, 40), (3, 43)]);
        let files = std::fs::read_dir(dir.path().join("population"))
            .unwrap()
            .count();
        assert_eq!(files, 2, "the earlier round's checkpoints are gone");
        // A lost checkpoint file: the population does not read back (PBT starts over).
        std::fs::remove_file(dir.path().join(&saved.members[1].0.checkpoint)).unwrap();
        assert!(load_population(dir.path()).is_none());
    }
}
