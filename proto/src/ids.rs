//! Identifier newtypes. IDs never travel as bare `String`s inside the crates.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id `value`, as given.
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.to_owned())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }
    };
}

string_id!(
    /// A node as named by its operator (`--node-id`); stable across agent restarts.
    NodeId
);
string_id!(
    /// A pool of actors, named by the user.
    PoolName
);
string_id!(
    /// One resident actor; stays the same across restarts of that actor.
    ActorId
);
string_id!(
    /// One submitted job (a stream of tasks).
    JobId
);

impl ActorId {
    /// A fresh, globally unique actor id with a readable pool prefix and 128 random bits
    /// (an agent that adopts actors by id must not be able to guess another's).
    pub fn generate(pool: &PoolName) -> Self {
        let mut bits = [0u8; 16];
        getrandom::fill(&mut bits).expect("the operating system's random source");
        Self(format!("{}-{:032x}", pool, u128::from_be_bytes(bits)))
    }
}

impl JobId {
    /// A fresh random job id (a UUID v4).
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }
}

/// A task as the scheduler numbers it; unique within one scheduler process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task-{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_actor_id_carries_128_random_bits_after_its_pool() {
        let pool = PoolName::new("embed");
        let a = ActorId::generate(&pool);
        let b = ActorId::generate(&pool);
        assert_ne!(a, b);
        let bits = a.as_str().strip_prefix("embed-").expect("the pool prefix");
        assert_eq!(bits.len(), 32);
        assert!(bits.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
