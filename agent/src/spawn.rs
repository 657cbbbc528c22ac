//! Starting a child from an exec spec: resolving its program, working directory and user,
//! wiring its standard streams (pipes, or a terminal), and forking it under the reaper's lock.
//!
//! Everything that can fail for a reason the user can fix (a command not in `PATH`, a missing
//! directory, an unknown user) is checked here before the fork, so the error says what to fix.
//! The common case (pipes, no user switch, an agent without an OOM shield) needs no code in
//! the child, so `std::process::Command` can use `posix_spawn` (vfork) instead of fork.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tether_proto::op::{Command, ExecSpec};
use tether_proto::ErrorCode;
use tokio::sync::oneshot;

use crate::pty::{self, Pty};
use crate::reaper::{Ended, Reaper};
use crate::stream::OpError;
use crate::sys::{ChildSetup, Credentials};
use crate::users;

/// `PATH` when neither the spec nor the agent's environment has one.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Kernel buffer of each output pipe: 1 MiB (the default 64 KiB makes a fast writer block,
/// and both sides switch, every 64 KiB). Pipe pages are allocated only as they fill.
const PIPE_BYTES: i32 = 1 << 20;

/// A started child.
#[derive(Debug)]
pub(crate) struct Child {
    /// Its pid, which is also its process group id (and its session id under a PTY).
    pub pid: i32,
    /// Receives its status when the reaper reaps it.
    pub ended: oneshot::Receiver<Ended>,
    /// The agent's ends of its standard streams, all non-blocking.
    pub io: ChildIo,
}

/// The agent's ends of a child's standard streams.
#[derive(Debug)]
pub(crate) enum ChildIo {
    /// Separate pipes.
    Pipes {
        /// Write end of its stdin, when the client sends stdin.
        stdin: Option<OwnedFd>,
        /// Read end of its stdout (and stderr when merged).
        stdout: OwnedFd,
        /// Read end of its stderr, unless merged into stdout.
        stderr: Option<OwnedFd>,
    },
    /// A terminal: its master carries input and output.
    Pty {
        /// The master side.
        master: OwnedFd,
    },
}

/// What a child must not inherit from the agent, decided once when the agent starts.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Inheritance {
    /// Undo the agent's OOM shield.
    pub reset_oom: bool,
    /// Restore every signal's default action in the child, which would otherwise inherit
    /// ignored signals: those the agent was started with (by `nohup`, a shell, or a relay
    /// that was), or, under glibc, those its `posix_spawn` ignores. User commands start clean.
    pub default_signals: bool,
}

/// Refuses what PROTOCOL.md §9 `exec` rules out: a `timeout_ms` of 0, and environment
/// names that are empty or hold `=` or NUL (the kernel would split `A=B=c` as `A` = `B=c`),
/// or values holding NUL.
fn check_fields(spec: &ExecSpec) -> Result<(), OpError> {
    if spec.timeout_ms == Some(0) {
        return Err(OpError::new(
            ErrorCode::InvalidArgument,
            "timeout_ms must be at least 1; leave it out for no timeout",
        ));
    }
    let text = spec.env.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
    let bytes = spec
        .env_bytes
        .iter()
        .map(|(n, v)| (n.as_bytes(), v.as_bytes()));
    for (name, value) in text.chain(bytes) {
        let shown = name.escape_ascii();
        if name.is_empty() || name.contains(&b'=') || name.contains(&0) {
            return Err(OpError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "environment variable name \"{shown}\" is invalid: a name is not empty and \
                     holds no `=` or NUL"
                ),
            ));
        }
        if value.contains(&0) {
            return Err(OpError::new(
                ErrorCode::InvalidArgument,
                format!("the value of environment variable {shown} holds a NUL byte"),
            ));
        }
    }
    let nul = match &spec.command {
        Command::Argv(argv) => argv.iter().any(|a| a.contains(0)),
        Command::Shell(script) => script.contains(0),
    };
    if nul {
        return Err(OpError::new(
            ErrorCode::InvalidArgument,
            "the command holds a NUL byte, which no argument can carry",
        ));
    }
    Ok(())
}

/// Starts the child described by `spec`. `workdir` is the default (and base of a relative)
/// working directory; `inheritance` says what of the agent's state the child undoes.
pub(crate) fn spawn(
    spec: &ExecSpec,
    workdir: &Path,
    inheritance: Inheritance,
    reaper: &Reaper,
) -> Result<Child, OpError> {
    check_fields(spec)?;
    let cwd = working_dir(spec.cwd.as_ref().map(|d| d.as_path()), workdir)?;
    let account = match &spec.user {
        Some(user) => Some(account(user)?),
        None => None,
    };
    let path_var = spec
        .env
        .get("PATH")
        .cloned()
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_else(|| DEFAULT_PATH.to_string());

    let mut cmd = match &spec.command {
        Command::Argv(argv) => {
            let name = argv.first().filter(|a| !a.is_empty()).ok_or_else(|| {
                OpError::new(ErrorCode::InvalidArgument, "the command's argv is empty")
            })?;
            let program = find_program(name.as_os_str(), &path_var, &cwd)?;
            let mut cmd = std::process::Command::new(program);
            cmd.arg0(name.as_os_str())
                .args(argv[1..].iter().map(|a| a.as_os_str()));
            cmd
        }
        Command::Shell(script) => {
            let mut cmd = std::process::Command::new("/bin/sh");
            cmd.arg("-c").arg(script.as_os_str());
            cmd
        }
    };

    let mut setup = ChildSetup {
        reset_oom: inheritance.reset_oom,
        default_signals: inheritance.default_signals,
        ..ChildSetup::default()
    };
    if let Some(account) = &account {
        cmd.env("HOME", &account.home)
            .env("USER", &account.name)
            .env("LOGNAME", &account.name);
        setup.credentials = Some(Credentials {
            uid: account.uid,
            gid: account.gid,
            groups: users::groups_of(&account.name, account.gid),
        });
        // Entered after the switch, so the user's own permissions decide.
        setup.chdir = Some(CString::new(cwd.as_os_str().as_bytes()).map_err(|_| {
            OpError::new(
                ErrorCode::InvalidPath,
                "the working directory contains a NUL byte",
            )
        })?);
    } else {
        cmd.current_dir(&cwd);
    }
    cmd.envs(&spec.env);
    cmd.envs(
        spec.env_bytes
            .iter()
            .map(|(n, v)| (n.as_os_str(), v.as_os_str())),
    );

    let io = if let Some(term) = &spec.pty {
        let pty = Pty::open(term.cols, term.rows)
            .map_err(|e| OpError::io("cannot open a pseudo-terminal", &e))?;
        let term_name = term
            .term
            .as_deref()
            .or(spec.env.get("TERM").map(String::as_str));
        cmd.env("TERM", term_name.unwrap_or(pty::DEFAULT_TERM));
        let slave = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
        let dup_err = |e: std::io::Error| OpError::io("cannot duplicate the terminal", &e);
        cmd.stdin(slave(&pty.slave).map_err(dup_err)?)
            .stdout(slave(&pty.slave).map_err(dup_err)?)
            .stderr(Stdio::from(pty.slave));
        // setsid() in the child makes it a session and group leader.
        setup.controlling_tty = true;
        ChildIo::Pty { master: pty.master }
    } else {
        let stdin = if spec.stdin {
            let (read, write) = pipe()?;
            cmd.stdin(Stdio::from(read));
            Some(write)
        } else {
            cmd.stdin(Stdio::null());
            None
        };
        let (stdout, out_write) = pipe()?;
        let stderr = if spec.merge_stderr {
            // One pipe for both: the bytes arrive in the order they were written.
            let dup = out_write
                .try_clone()
                .map_err(|e| OpError::io("cannot duplicate a pipe", &e))?;
            cmd.stderr(Stdio::from(dup));
            None
        } else {
            let (read, write) = pipe()?;
            cmd.stderr(Stdio::from(write));
            Some(read)
        };
        cmd.stdout(Stdio::from(out_write));
        cmd.process_group(0);
        ChildIo::Pipes {
            stdin,
            stdout,
            stderr,
        }
    };
    setup.install(&mut cmd);

    let program = cmd.get_program().to_string_lossy().into_owned();
    let (pid, ended) = reaper
        .spawn(|| cmd.spawn().map(|child| child.id()))
        .map_err(|e| OpError::io(&format!("cannot run {program}"), &e))?;
    // The command holds the child's ends of the pipes; the parent must not.
    drop(cmd);

    match &io {
        ChildIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            for fd in stdin.iter().chain([stdout]).chain(stderr) {
                set_nonblocking(fd)?;
            }
        }
        ChildIo::Pty { master } => set_nonblocking(master)?,
    }
    Ok(Child { pid, ended, io })
}

fn working_dir(cwd: Option<&Path>, workdir: &Path) -> Result<PathBuf, OpError> {
    let dir = match cwd {
        Some(d) => workdir.join(d),
        None => workdir.to_path_buf(),
    };
    // Programs are found relative to it, so it must not itself be relative.
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => Ok(dir),
        Ok(_) => Err(OpError::new(
            ErrorCode::NotADirectory,
            format!("working directory {} is not a directory", dir.display()),
        )),
        Err(e) => Err(OpError::new(
            ErrorCode::from_io(&e),
            format!("working directory {}: {e}", dir.display()),
        )),
    }
}

fn account(user: &str) -> Result<users::Account, OpError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(OpError::new(
            ErrorCode::PermissionDenied,
            format!("cannot run as user {user:?}: the agent does not run as root"),
        ));
    }
    users::lookup(user).ok_or_else(|| {
        OpError::new(
            ErrorCode::NotFound,
            format!("no user {user:?} in /etc/passwd; give an existing name or a numeric uid"),
        )
    })
}

/// Finds `name` as `execvp` would: a name with a slash is a path (relative to `cwd`), any
/// other is searched in `path_var`. Done here so "not found" is a clear error, and so the
/// program is a path, which keeps `Command` on its `posix_spawn` path.
fn find_program(name: &OsStr, path_var: &str, cwd: &Path) -> Result<PathBuf, OpError> {
    let shown = Path::new(name).display();
    if name.as_bytes().contains(&b'/') {
        let path = cwd.join(name);
        return match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => Err(OpError::new(
                ErrorCode::IsDirectory,
                format!("{shown} is a directory, not a program"),
            )),
            Ok(meta) if meta.permissions().mode() & 0o111 == 0 => Err(OpError::new(
                ErrorCode::PermissionDenied,
                format!("{shown} is not executable"),
            )),
            Ok(_) => Ok(path),
            Err(e) => Err(OpError::new(
                ErrorCode::from_io(&e),
                format!("cannot run {shown}: {e}"),
            )),
        };
    }
    let mut not_executable = None;
    for dir in path_var.split(':') {
        let candidate = cwd.join(if dir.is_empty() { "." } else { dir }).join(name);
        match std::fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => {
                return Ok(candidate)
            }
            Ok(meta) if meta.is_file() => not_executable = not_executable.or(Some(candidate)),
            _ => {}
        }
    }
    Err(match not_executable {
        Some(path) => OpError::new(
            ErrorCode::PermissionDenied,
            format!("{shown}: {} is not executable", path.display()),
        ),
        None => OpError::new(
            ErrorCode::NotFound,
            format!("command not found: {shown} (searched PATH={path_var})"),
        ),
    })
}

/// A close-on-exec pipe, `(read, write)`, with a large buffer.
fn pipe() -> Result<(OwnedFd, OwnedFd), OpError> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| OpError::io("cannot create a pipe", &e.into()))?;
    // Best effort: an unprivileged agent may be capped lower by fs.pipe-max-size.
    let _ = fcntl(read.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
    Ok((read, write))
}

fn set_nonblocking(fd: &OwnedFd) -> Result<(), OpError> {
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
        .map(drop)
        .map_err(|e| OpError::io("cannot make a descriptor non-blocking", &e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_programs_in_path() {
        let sh = find_program(OsStr::new("sh"), DEFAULT_PATH, Path::new("/")).unwrap();
        assert!(sh.ends_with("sh"), "{}", sh.display());
        let err = find_program(
            OsStr::new("no-such-command-xyz"),
            "/bin:/usr/bin",
            Path::new("/"),
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert!(err
            .message
            .contains("command not found: no-such-command-xyz"));
        let err = find_program(OsStr::new("./nope"), DEFAULT_PATH, Path::new("/")).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        let err = find_program(OsStr::new("/etc"), DEFAULT_PATH, Path::new("/")).unwrap_err();
        assert_eq!(err.code, ErrorCode::IsDirectory);
        let err =
            find_program(OsStr::new("/etc/passwd"), DEFAULT_PATH, Path::new("/")).unwrap_err();
        assert_eq!(err.code, ErrorCode::PermissionDenied);
    }

    #[test]
    fn checks_the_working_directory() {
        assert_eq!(
            working_dir(None, Path::new("/tmp")).unwrap(),
            Path::new("/tmp")
        );
        assert_eq!(
            working_dir(Some(Path::new("/")), Path::new("/tmp")).unwrap(),
            Path::new("/")
        );
        let missing = working_dir(Some(Path::new("no/such/dir")), Path::new("/tmp")).unwrap_err();
        assert_eq!(missing.code, ErrorCode::NotFound);
        let file = working_dir(Some(Path::new("/etc/passwd")), Path::new("/")).unwrap_err();
        assert_eq!(file.code, ErrorCode::NotADirectory);
    }
}
