//! Why a program could not be started or waited for.

use std::io;
use std::path::PathBuf;

/// Why a program could not be started (or waited for).
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The program does not exist (or is not executable).
    #[error("`{program}` was not found; install it or put it on PATH")]
    NotFound { program: String },
    /// Anything else: an empty command, a missing working directory, an I/O error.
    #[error(transparent)]
    Other(#[from] SpawnFailure),
    /// A limit of the machine was reached (open files, disk space, file size) while the
    /// program was started or its output written: not the program's failure, nor its
    /// stage's. The program, if it started, was stopped.
    #[error(transparent)]
    Limit(#[from] super::limit::LimitHit),
}

/// A failure to run a program other than its absence.
#[derive(Debug, thiserror::Error)]
pub enum SpawnFailure {
    #[error("nothing to run: the command is empty")]
    EmptyCommand,
    #[error("the working directory {} does not exist", .0.display())]
    NoWorkingDirectory(PathBuf),
    #[error("could not start `{program}`")]
    Start {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("`{0}` has no process id")]
    NoProcessId(String),
    #[error("waiting for `{program}`")]
    Wait {
        program: String,
        #[source]
        source: io::Error,
    },
}

impl SpawnError {
    /// The whole message, causes included, naming the program (`program`, the argv's first
    /// word) where the error does not: "`make` could not start: the working directory /x
    /// does not exist".
    pub fn message(&self, program: &str) -> String {
        let why = crate::diag::error_chain(self);
        if self.names_program() {
            why
        } else {
            format!("`{program}` could not start: {why}")
        }
    }

    /// Tells whether the message names the program (an empty command or a missing working
    /// directory does not).
    fn names_program(&self) -> bool {
        !matches!(
            self,
            SpawnError::Other(SpawnFailure::EmptyCommand | SpawnFailure::NoWorkingDirectory(_))
        )
    }
}

/// Errors are equal when they are of the same kind and say the same (I/O errors have no
/// equality of their own).
impl PartialEq for SpawnError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (SpawnError::NotFound { program: a }, SpawnError::NotFound { program: b }) => a == b,
            (SpawnError::Other(a), SpawnError::Other(b)) => {
                std::mem::discriminant(a) == std::mem::discriminant(b)
                    && crate::backend::error_chain(a) == crate::backend::error_chain(b)
            }
            (SpawnError::Limit(a), SpawnError::Limit(b)) => {
                a.limit == b.limit && a.to_string() == b.to_string()
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_errors_that_name_the_program_say_so() {
        let not_found = SpawnError::NotFound {
            program: "x".into(),
        };
        assert!(not_found.names_program() && not_found.to_string().contains("`x`"));
        let empty = SpawnError::Other(SpawnFailure::EmptyCommand);
        assert!(!empty.names_program());
        let cwd = SpawnError::Other(SpawnFailure::NoWorkingDirectory("/nope".into()));
        assert!(!cwd.names_program() && !cwd.to_string().contains('`'));
        // The message names it either way, once.
        assert_eq!(
            not_found.message("x"),
            "`x` was not found; install it or put it on PATH"
        );
        assert_eq!(
            cwd.message("make"),
            "`make` could not start: the working directory /nope does not exist"
        );
    }
}
