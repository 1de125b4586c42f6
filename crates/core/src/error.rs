//! One error type for the whole domain, free of any transport. The server maps each variant to an
//! HTTP status and a JSON body; the CLI prints the message. Internal causes stay in the logs.

use std::fmt;

/// What went wrong, in terms a caller can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is malformed or breaks a rule; `field` names the offending input.
    #[error("{field}: {message}")]
    InvalidInput { field: String, message: String },
    /// Several inputs break rules at once: every one is named, so that a caller fixes them all
    /// in one go (always two or more; one is [`Error::InvalidInput`]).
    #[error("{}", .0.iter().map(|p| format!("{}: {}", p.field, p.message)).collect::<Vec<_>>().join("; "))]
    InvalidFields(Vec<FieldProblem>),
    /// No such object for this caller. Also returned for other tenants' objects, so that
    /// existence never leaks across tenants.
    #[error("{kind} not found")]
    NotFound { kind: ObjectKind },
    /// The request carries no valid credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is known but its role does not allow this action.
    #[error("{0}")]
    Forbidden(String),
    /// The request conflicts with the current state (a finished job cannot be cancelled, an
    /// idempotency key was reused with a different request, a name is taken).
    #[error("{0}")]
    Conflict(String),
    /// An object of that name already exists (MLflow answers this one with its own code).
    #[error("{0}")]
    AlreadyExists(String),
    /// A dependency (the database) is not answering.
    #[error("{0}")]
    Unavailable(String),
    /// Too many failed attempts (authentication); try again after `retry_after_secs`.
    #[error("{message}")]
    TooManyRequests { message: String, retry_after_secs: u64 },
    /// A write of the control loops was refused because this server no longer holds the
    /// leadership epoch it wrote with (another server took over).
    #[error("fenced: {0}")]
    Fenced(String),
    /// A bug or an unexpected failure. The message is logged, never sent to the caller.
    #[error("internal error: {0}")]
    Internal(String),
}

/// One input that breaks a rule, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct FieldProblem {
    /// The input, as a path such as `resources.gpus`.
    pub field: String,
    pub message: String,
}

/// Collects every broken rule of an input before answering, instead of stopping at the first.
#[derive(Debug, Default)]
pub struct Problems(Vec<FieldProblem>);

impl Problems {
    pub fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldProblem { field: field.into(), message: message.into() });
    }

    /// Adds the problem of a check that returned one.
    pub fn check(&mut self, outcome: Result<(), Error>) {
        match outcome {
            Ok(()) => {}
            Err(Error::InvalidInput { field, message }) => self.add(field, message),
            Err(Error::InvalidFields(problems)) => self.0.extend(problems),
            Err(other) => self.add("", other.to_string()),
        }
    }

    /// How many problems were found so far.
    pub fn count(&self) -> usize {
        self.0.len()
    }

    /// `Ok` when nothing broke a rule; else one error naming each problem.
    pub fn into_result(mut self) -> Result<(), Error> {
        match self.0.len() {
            0 => Ok(()),
            1 => {
                let FieldProblem { field, message } = self.0.remove(0);
                Err(Error::InvalidInput { field, message })
            }
            _ => Err(Error::InvalidFields(self.0)),
        }
    }
}

impl Error {
    /// Every input problem of an error: one for [`Error::InvalidInput`], each of
    /// [`Error::InvalidFields`], none for any other error.
    pub fn field_problems(&self) -> Vec<FieldProblem> {
        match self {
            Error::InvalidInput { field, message } => {
                vec![FieldProblem { field: field.clone(), message: message.clone() }]
            }
            Error::InvalidFields(problems) => problems.clone(),
            _ => Vec::new(),
        }
    }
}

/// The kinds of objects a caller can ask for; used in not-found errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    Job,
    Tenant,
    User,
    Token,
    Attempt,
    Log,
    /// A path the API does not have.
    Route,
    Template,
    Dataset,
    Artifact,
    Volume,
    /// A checkpoint a job wrote, by step.
    Checkpoint,
    /// An MLflow experiment.
    Experiment,
    /// An MLflow run.
    Run,
    /// A tag of an MLflow run.
    Tag,
    /// An interactive session (a notebook).
    Session,
    /// A notification subscription.
    Subscription,
    /// A user's membership of a tenant.
    Member,
    /// A node the executor reports.
    Node,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Job => "job",
            ObjectKind::Tenant => "tenant",
            ObjectKind::User => "user",
            ObjectKind::Token => "token",
            ObjectKind::Attempt => "attempt",
            ObjectKind::Log => "log",
            ObjectKind::Route => "route",
            ObjectKind::Template => "template",
            ObjectKind::Dataset => "dataset",
            ObjectKind::Session => "session",
            ObjectKind::Subscription => "subscription",
            ObjectKind::Member => "member",
            ObjectKind::Node => "node",
            ObjectKind::Artifact => "artifact",
            ObjectKind::Volume => "volume",
            ObjectKind::Checkpoint => "checkpoint",
            ObjectKind::Experiment => "experiment",
            ObjectKind::Run => "run",
            ObjectKind::Tag => "tag",
        })
    }
}

impl Error {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidInput { field: field.into(), message: message.into() }
    }

    pub fn not_found(kind: ObjectKind) -> Self {
        Error::NotFound { kind }
    }

    pub fn internal(cause: impl fmt::Display) -> Self {
        Error::Internal(cause.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
