//! The program the sandbox init runs from: the relay's own executable, pinned by a descriptor
//! opened when the provider is made, so that a relay whose file on disk is replaced (a package
//! upgrade, `cargo install`, a new build) or deleted keeps starting sandboxes, with the very
//! code it runs, until it is restarted.
//!
//! The init is started as `/proc/self/fd/N`, which the kernel resolves to the pinned file
//! itself, deleted or not (what `fexecve` does without `execveat`). That keeps the spawn on
//! `posix_spawn`, where an `execveat` between fork and exec would force a full fork of the
//! multi-threaded relay. The descriptor is close-on-exec: the exec opens the file before
//! descriptors are closed, which works for an ELF binary (a script's interpreter could not
//! reopen it afterwards, but the relay is never a script).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::error::LocalError;

/// Where the running executable can be opened, whatever became of its path.
const SELF_EXE: &str = "/proc/self/exe";

/// The relay's executable, held open for as long as the process lives.
#[derive(Debug)]
pub(super) struct OwnBinary {
    /// Open read-only and close-on-exec (std opens every file with `O_CLOEXEC`).
    file: File,
    /// Its path when it was pinned, to notice a replacement.
    path: PathBuf,
    /// Its device and inode when it was pinned.
    identity: (u64, u64),
    /// Set once the replacement has been logged.
    warned: AtomicBool,
}

/// A program to start the sandbox init with.
#[derive(Clone, Debug)]
pub(super) struct InitProgram {
    /// What to exec.
    pub path: PathBuf,
    /// How to name it in errors and in the init's `argv[0]`.
    pub name: String,
}

impl OwnBinary {
    /// The process's pinned executable: opened on the first call (when the first provider is
    /// made, at relay start), and the same descriptor ever after. An error says why the
    /// executable cannot be opened.
    pub(super) fn get() -> &'static Result<OwnBinary, String> {
        static PINNED: OnceLock<Result<OwnBinary, String>> = OnceLock::new();
        PINNED.get_or_init(OwnBinary::pin)
    }

    fn pin() -> Result<OwnBinary, String> {
        let file = File::open(SELF_EXE).map_err(|e| {
            format!(
                "the local provider starts sandboxes from the relay's own binary, which cannot \
                 be opened through {SELF_EXE} ({e}); mount /proc"
            )
        })?;
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot inspect the relay's own binary: {e}"))?;
        let path = std::fs::read_link(SELF_EXE).unwrap_or_else(|_| PathBuf::from(SELF_EXE));
        Ok(OwnBinary {
            file,
            path,
            identity: (meta.dev(), meta.ino()),
            warned: AtomicBool::new(false),
        })
    }

    /// The program that runs the pinned executable. Logs a warning, once per process, when the
    /// file at its path is no longer the one running.
    pub(super) fn program(&self) -> InitProgram {
        if self.replaced() && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the relay's binary {} changed on disk since the relay started; new sandboxes \
                 keep starting from the running version until the relay is restarted",
                self.path.display()
            );
        }
        InitProgram {
            path: PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd())),
            name: self.path.display().to_string(),
        }
    }

    /// True when the path no longer leads to the file we run (renamed over, or deleted).
    fn replaced(&self) -> bool {
        match std::fs::metadata(&self.path) {
            Ok(meta) => (meta.dev(), meta.ino()) != self.identity,
            Err(_) => true,
        }
    }
}

/// The program for the relay's own binary, or why there is none.
pub(super) fn own_program() -> Result<InitProgram, LocalError> {
    match OwnBinary::get() {
        Ok(own) => Ok(own.program()),
        Err(reason) => Err(LocalError::Unavailable(reason.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_binary_is_this_executable() {
        let own = OwnBinary::get().as_ref().expect("pinned");
        let program = own.program();
        let exe = std::env::current_exe().unwrap();
        assert_eq!(program.name, exe.display().to_string());
        let through_fd = std::fs::metadata(&program.path).unwrap();
        let on_disk = std::fs::metadata(&exe).unwrap();
        assert_eq!(
            (through_fd.dev(), through_fd.ino()),
            (on_disk.dev(), on_disk.ino())
        );
        assert!(!own.replaced());
    }
}
