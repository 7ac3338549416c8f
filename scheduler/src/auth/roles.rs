//! Who may do what: roles, principals and the one function that decides. Pure, no I/O.

use std::fmt;
use std::str::FromStr;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything on the client API (not agent sessions: a leaked admin token makes no node).
    Admin,
    /// Pools and jobs; cancels only its own jobs.
    Submit,
    /// Status and listings.
    Read,
    /// Opens an agent session and nothing else.
    Agent,
    /// Auth is off (loopback, `--insecure`, `Cluster::local()`): every call is allowed.
    #[serde(skip)]
    Open,
}

impl Role {
    /// The role's name in the auth file.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Submit => "submit",
            Role::Read => "read",
            Role::Agent => "agent",
            Role::Open => "open",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "admin" => Ok(Role::Admin),
            "submit" => Ok(Role::Submit),
            "read" => Ok(Role::Read),
            "agent" => Ok(Role::Agent),
            other => Err(format!(
                "unknown role `{other}`; roles: admin, submit, read, agent"
            )),
        }
    }
}

/// The caller of one request, as authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The token's name from the auth file (`anonymous` when auth is off).
    pub name: String,
    /// What it may do.
    pub role: Role,
}

impl Principal {
    /// The name of the caller when auth is off.
    pub const ANONYMOUS: &'static str = "anonymous";

    /// The caller when auth is off: every call allowed.
    pub fn anonymous() -> Self {
        Self {
            name: Self::ANONYMOUS.to_owned(),
            role: Role::Open,
        }
    }
}

/// Everything a principal can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Status, pools, jobs, nodes, actors.
    Read,
    /// Create, scale or delete a pool.
    ManagePools,
    /// Submit a job, or resume one.
    SubmitJob,
    /// Cancel a job.
    CancelJob,
    /// Set what a running job reports about itself (a sweep's leaderboard).
    AnnotateJob,
    /// Register as a node agent.
    AgentSession,
}

impl Action {
    fn describe(self) -> &'static str {
        match self {
            Action::Read => "reading cluster state",
            Action::ManagePools => "creating, scaling or deleting pools",
            Action::SubmitJob => "submitting jobs",
            Action::CancelJob => "cancelling jobs",
            Action::AnnotateJob => "setting a job's summary",
            Action::AgentSession => "opening an agent session",
        }
    }
}

/// How far a permission reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every job and pool.
    Any,
    /// Only the jobs the principal submitted, or the pools it created.
    Own,
}

/// Why an action was refused; its text says what the principal has and what it needs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessRefusal {
    /// The token's role does not allow the action at all.
    #[error("{}", role_refusal(.token, *.role, *.action))]
    Role {
        /// The token's name.
        token: String,
        /// Its role.
        role: Role,
        /// What it asked to do.
        action: Action,
    },
    /// A submit token asked to change a job another token submitted.
    #[error(
        "token `{token}` has role submit and may {verb} only its own jobs; this job belongs to `{owner}` (an admin token may {verb} it)"
    )]
    NotItsJob {
        /// The token's name.
        token: String,
        /// `cancel` or `annotate`.
        verb: &'static str,
        /// The token that submitted the job.
        owner: String,
    },
    /// A submit token asked to change a pool another token created.
    #[error(
        "token `{token}` has role submit and may scale or delete only the pools it created; pool `{pool}` belongs to `{owner}` (an admin token may change it; jobs may still run on it)"
    )]
    NotItsPool {
        /// The token's name.
        token: String,
        /// The pool.
        pool: String,
        /// The token that created it.
        owner: String,
    },
}

/// Decides one action; a refusal says what the principal has and what the action needs.
pub fn authorize(principal: &Principal, action: Action) -> Result<Scope, AccessRefusal> {
    use Action as A;
    use Role as R;
    let allowed = match (principal.role, action) {
        (R::Open, _) => Some(Scope::Any),
        (R::Agent, A::AgentSession) => Some(Scope::Any),
        (R::Agent, _) | (_, A::AgentSession) => None,
        (R::Admin, _) => Some(Scope::Any),
        (R::Submit, A::CancelJob | A::AnnotateJob | A::ManagePools) => Some(Scope::Own),
        (R::Submit, _) => Some(Scope::Any),
        (R::Read, A::Read) => Some(Scope::Any),
        (R::Read, _) => None,
    };
    allowed.ok_or_else(|| AccessRefusal::Role {
        token: principal.name.clone(),
        role: principal.role,
        action,
    })
}

fn role_refusal(token: &str, role: Role, action: Action) -> String {
    let needs = match action {
        Action::Read => "role read, submit or admin",
        Action::ManagePools | Action::SubmitJob | Action::CancelJob | Action::AnnotateJob => {
            "role submit or admin"
        }
        Action::AgentSession => {
            "an agent token (`resident token create --role agent`); client tokens cannot join as nodes"
        }
    };
    let hint = if role == Role::Agent {
        "; agent tokens serve only agent sessions, use a client token"
    } else {
        ""
    };
    format!(
        "token `{token}` has role {role}; {} needs {needs}{hint}",
        action.describe()
    )
}

/// Whether `principal` may cancel a job owned by `owner`.
pub fn may_cancel(principal: &Principal, owner: &str) -> Result<(), AccessRefusal> {
    may_change_job(principal, owner, Action::CancelJob, "cancel")
}

/// Whether `principal` may set the summary of a job owned by `owner`.
pub fn may_annotate(principal: &Principal, owner: &str) -> Result<(), AccessRefusal> {
    may_change_job(principal, owner, Action::AnnotateJob, "annotate")
}

fn may_change_job(
    principal: &Principal,
    owner: &str,
    action: Action,
    verb: &'static str,
) -> Result<(), AccessRefusal> {
    match authorize(principal, action)? {
        Scope::Any => Ok(()),
        Scope::Own if principal.name == owner => Ok(()),
        Scope::Own => Err(AccessRefusal::NotItsJob {
            token: principal.name.clone(),
            verb,
            owner: owner.to_owned(),
        }),
    }
}

/// Whether `principal` may change (scale, delete, reconfigure) a pool that `owner` created.
/// A pool saved before pools had owners (`owner` empty) is anyone's who may manage pools.
pub fn may_manage_pool(
    principal: &Principal,
    pool: &str,
    owner: &str,
) -> Result<(), AccessRefusal> {
    match authorize(principal, Action::ManagePools)? {
        Scope::Any => Ok(()),
        Scope::Own if owner.is_empty() || principal.name == owner => Ok(()),
        Scope::Own => Err(AccessRefusal::NotItsPool {
            token: principal.name.clone(),
            pool: pool.to_owned(),
            owner: owner.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(role: Role) -> Principal {
        Principal {
            name: format!("{role}-1"),
            role,
        }
    }

    #[test]
    fn role_table() {
        let actions = [
            Action::Read,
            Action::ManagePools,
            Action::SubmitJob,
            Action::CancelJob,
            Action::AgentSession,
        ];
        let expect = |role, allowed: [bool; 5]| {
            for (action, allowed) in actions.iter().zip(allowed) {
                assert_eq!(
                    authorize(&who(role), *action).is_ok(),
                    allowed,
                    "{role} {action:?}"
                );
            }
        };
        expect(Role::Admin, [true, true, true, true, false]);
        expect(Role::Submit, [true, true, true, true, false]);
        expect(Role::Read, [true, false, false, false, false]);
        expect(Role::Agent, [false, false, false, false, true]);
        expect(Role::Open, [true, true, true, true, true]);
    }

    #[test]
    fn submit_cancels_only_its_own_jobs() {
        let alice = Principal {
            name: "alice".into(),
            role: Role::Submit,
        };
        assert!(may_cancel(&alice, "alice").is_ok());
        let refused = may_cancel(&alice, "bob").unwrap_err().to_string();
        assert!(refused.contains("belongs to `bob`"), "{refused}");
        assert!(may_cancel(&who(Role::Admin), "bob").is_ok());
        assert!(may_cancel(&who(Role::Read), "read-1").is_err());
    }

    #[test]
    fn submit_manages_only_its_own_pools() {
        let alice = Principal {
            name: "alice".into(),
            role: Role::Submit,
        };
        assert!(may_manage_pool(&alice, "p", "alice").is_ok());
        assert!(
            may_manage_pool(&alice, "p", "").is_ok(),
            "a pool from before owners"
        );
        let refused = may_manage_pool(&alice, "p", "bob").unwrap_err().to_string();
        assert!(refused.contains("pool `p` belongs to `bob`"), "{refused}");
        assert!(may_manage_pool(&who(Role::Admin), "p", "bob").is_ok());
        assert!(may_manage_pool(&who(Role::Open), "p", "bob").is_ok());
        assert!(may_manage_pool(&who(Role::Read), "p", "read-1").is_err());
    }

    #[test]
    fn refusals_say_what_is_needed() {
        let refused = authorize(&who(Role::Read), Action::ManagePools)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("has role read"), "{refused}");
        assert!(refused.contains("needs role submit or admin"), "{refused}");
        let refused = authorize(&who(Role::Admin), Action::AgentSession)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("--role agent"), "{refused}");
        let refused = authorize(&who(Role::Agent), Action::Read)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("use a client token"), "{refused}");
    }

    #[test]
    fn roles_parse() {
        assert_eq!("Submit".parse::<Role>(), Ok(Role::Submit));
        assert!("open".parse::<Role>().unwrap_err().contains("roles: admin"));
    }
}
