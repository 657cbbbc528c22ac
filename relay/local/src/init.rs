//! The sandbox init: the relay binary re-executed as `tether __sandbox-init`, single-threaded,
//! in its own session so the sandbox outlives the relay. It binds the agent's socket, creates
//! the user (non-root relays) and PID namespaces, and forks. The child, PID 1 of the new PID
//! namespace, builds the root, drops privileges and execs the agent. The parent stays behind
//! as a tiny monitor outside the sandbox: it moves PID 1 into the sandbox's cgroup, then
//! reaps it (the host's init may not reap orphans) and exits with it.
//!
//! Moving a process between cgroups can wait out an RCU grace period (milliseconds on v1), so
//! the monitor does it while PID 1 builds its root; PID 1 waits on a pipe for it to finish
//! before it enters its cgroup namespace and execs, so the agent and everything it starts are
//! always contained.
//!
//! The relay writes an [`InitConfig`] on stdin and reads [`Report`]s from stdout, which the init
//! moves to a close-on-exec descriptor: the pipe reaches end-of-file exactly when the agent's
//! exec succeeded (or everything failed), with no polling or sleeping.

use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::process;

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{chdir, dup2, execve, pipe2, sethostname, setsid, ForkResult, Pid};

use super::config::{IdMapping, InitConfig, Report};
use super::constants::{
    AGENT_ARGS, AGENT_LISTEN_FD, AGENT_OOM_SCORE_ADJ, AGENT_PATH, INIT_SUBCOMMAND, WORKSPACE,
};
use super::error::{InitError, Step};
use super::process::ProcessIdentity;
use super::{caps, namespaces, net, rootfs, seccomp, stage, sys, userns};
use tether_relay_core::provider::NetworkPolicy;

/// Descriptors at or above this number are free for the init's own use.
const PRIVATE_FD_MIN: i32 = 10;

/// Runs the sandbox init if this process was started as one (first argument
/// `__sandbox-init`), and never returns then; otherwise returns at once. The relay's `main`
/// must call this first, before starting threads, a runtime or logging.
pub fn run_if_sandbox_init() {
    if std::env::args_os().nth(1).as_deref() == Some(OsStr::new(INIT_SUBCOMMAND)) {
        sandbox_init_main();
    }
}

/// The sandbox init's entry point (see the module docs). Reads its configuration from stdin.
pub(crate) fn sandbox_init_main() -> ! {
    // Clean signals for the sandbox, whatever the relay inherited (`nohup`, a shell, a mask).
    // SIGPIPE stays ignored, as the Rust runtime set it, while the init writes to pipes;
    // `sys::reset_sigpipe` restores it right before the agent's exec.
    tether_signals::restore_default_dispositions(&[libc::SIGPIPE]);
    // Own session: a signal to the relay's process group or terminal never reaches sandboxes.
    let _ = setsid();
    let status = match take_status_pipe() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("tether sandbox init: {e}");
            process::exit(2);
        }
    };
    let code = match start() {
        Ok(Role::Monitor {
            child,
            config,
            contained,
        }) => match contain(&config, child, contained, &status) {
            Ok(()) => {
                drop(status);
                monitor(child)
            }
            Err(err) => {
                report_failure(&status, &err);
                let _ = kill(child, Signal::SIGKILL);
                monitor(child);
                1
            }
        },
        // The sandbox's PID 1: `run_pid1` returns only if a step failed.
        Ok(Role::Pid1 {
            config,
            listener,
            contained,
        }) => {
            let err = run_pid1(&config, &listener, contained);
            report_failure(&status, &err);
            1
        }
        Err(err) => {
            report_failure(&status, &err);
            1
        }
    };
    process::exit(code)
}

enum Role {
    /// The parent after the fork; `contained` is the write end of the containment pipe.
    Monitor {
        child: Pid,
        config: InitConfig,
        contained: OwnedFd,
    },
    /// The sandbox's PID 1; `contained` is the read end of the containment pipe.
    Pid1 {
        config: InitConfig,
        listener: OwnedFd,
        contained: OwnedFd,
    },
}

/// Moves the status pipe off stdout (which becomes the log, like stderr).
fn take_status_pipe() -> Result<File, InitError> {
    let status = sys::dup_above(std::io::stdout().as_fd(), PRIVATE_FD_MIN)
        .step(|| "moving the status pipe off stdout".into())?;
    dup2(2, 1).step(|| "sending stdout to the log".into())?;
    Ok(File::from(status))
}

/// Reads the configuration from stdin, then points stdin at `/dev/null`.
fn read_config() -> Result<InitConfig, InitError> {
    let mut text = Vec::new();
    std::io::stdin()
        .read_to_end(&mut text)
        .map_err(|e| InitError::Config(e.to_string()))?;
    let null = File::open("/dev/null").step(|| "opening /dev/null".into())?;
    dup2(null.as_raw_fd(), 0).step(|| "pointing stdin at /dev/null".into())?;
    serde_json::from_slice(&text).map_err(|e| InitError::Config(e.to_string()))
}

/// Everything before the fork: the socket while the host's file system is still ours, then
/// the user and PID namespaces, in the order the relay's privilege allows.
fn start() -> Result<Role, InitError> {
    // fork and unshare(CLONE_NEWUSER) are only sound in a single-threaded process.
    if thread_count() != Some(1) {
        return Err(InitError::Config(
            "the sandbox init is running with other threads; the relay's main must call \
             provider::local::run_if_sandbox_init before starting any thread or runtime"
                .into(),
        ));
    }
    let config = read_config()?;
    let socket = config.layout.socket();
    let listener = UnixListener::bind(&socket)
        .step(|| format!("binding the agent socket {}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .step(|| format!("restricting {}", socket.display()))?;
    let contained = pipe2(OFlag::O_CLOEXEC).step(|| "creating the containment pipe".into())?;

    // The agent keeps this score (it starts children at 0); only now, before a user namespace,
    // may it go below 0. A relay that is not root cannot, and its sandboxes keep its score.
    let _ = std::fs::write("/proc/self/oom_score_adj", AGENT_OOM_SCORE_ADJ.to_string());
    match config.users {
        IdMapping::Own { uid, gid } => {
            namespaces::enter_user_namespace(uid, gid)?;
            namespaces::new_pid_namespace()?;
            match sys::fork().step(|| "forking the sandbox's first process".into())? {
                ForkResult::Child => Ok(Role::Pid1 {
                    config,
                    listener: listener.into(),
                    contained: contained.0,
                }),
                ForkResult::Parent { child } => Ok(Role::Monitor {
                    child,
                    config,
                    contained: contained.1,
                }),
            }
        }
        IdMapping::Range { base, count, owner } => {
            start_mapped(config, listener.into(), contained, (base, count, owner))
        }
    }
}

/// A root relay's sandbox: the init stays root on the host and forks a child that becomes
/// the namespace's unprivileged owner and unshares it; the init maps the child's ids and
/// stages what PID 1 mounts (see `stage`); the child makes the PID namespace, forks PID 1 and
/// exits, leaving PID 1 to the init, which is a subreaper.
fn start_mapped(
    config: InitConfig,
    listener: OwnedFd,
    contained: (OwnedFd, OwnedFd),
    (base, count, owner): (u32, u32, u32),
) -> Result<Role, InitError> {
    sys::become_subreaper().step(|| "becoming the sandbox's subreaper".into())?;
    // PID 1 inherits this working directory and finds everything from it by relative paths.
    chdir(config.layout.dir())
        .step(|| format!("changing into {}", config.layout.dir().display()))?;
    let host_mounts = stage::private_mount_namespace()?;
    stage::agent(&config)?;
    let (go_read, go_write) = pipe2(OFlag::O_CLOEXEC).step(|| "creating a pipe".into())?;
    let (news_read, news_write) = pipe2(OFlag::O_CLOEXEC).step(|| "creating a pipe".into())?;
    match sys::fork().step(|| "forking the sandbox's namespace process".into())? {
        ForkResult::Child => {
            drop((go_write, news_read, contained.1, host_mounts));
            let mut news = File::from(news_write);
            userns::become_owner_and_unshare(base, owner)?;
            news.write_all(b"u")
                .step(|| "telling the init the namespace exists".into())?;
            let mut byte = [0u8; 1];
            if !matches!(File::from(go_read).read(&mut byte), Ok(1)) {
                return Err(InitError::Config(
                    "the init exited before mapping the sandbox's ids".into(),
                ));
            }
            userns::become_root_inside()?;
            namespaces::new_pid_namespace()?;
            match sys::fork().step(|| "forking the sandbox's first process".into())? {
                ForkResult::Child => Ok(Role::Pid1 {
                    config: config.staged(),
                    listener,
                    contained: contained.0,
                }),
                ForkResult::Parent { child } => {
                    let _ = news.write_all(child.as_raw().to_string().as_bytes());
                    process::exit(0)
                }
            }
        }
        ForkResult::Parent { child } => {
            drop((go_read, news_write, contained.0, listener));
            let mut news = File::from(news_read);
            let mut byte = [0u8; 1];
            if !matches!(news.read(&mut byte), Ok(1)) {
                let _ = waitpid(child, None);
                return Err(InitError::Config(
                    "the sandbox's namespace process failed; its error is in the sandbox log"
                        .into(),
                ));
            }
            userns::write_maps(child, base, count)?;
            stage::image(&config, child)?;
            File::from(go_write)
                .write_all(b"g")
                .step(|| "releasing the sandbox's namespace process".into())?;
            // The child (and PID 1 after it) keeps the staging namespace alive while it needs it.
            stage::leave(host_mounts)?;
            let mut pid = String::new();
            let _ = news.read_to_string(&mut pid);
            // Reaped, the intermediate process hands PID 1 to us, its subreaper.
            let _ = waitpid(child, None);
            let pid1 = pid.trim().parse::<i32>().map_err(|_| {
                InitError::Config("the sandbox's namespace process did not start PID 1".into())
            })?;
            Ok(Role::Monitor {
                child: Pid::from_raw(pid1),
                config,
                contained: contained.1,
            })
        }
    }
}

/// How many threads this process has, from `/proc/self/status`.
fn thread_count() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Threads:"))?;
    line["Threads:".len()..].trim().parse().ok()
}

/// Moves PID 1 into the sandbox's cgroup, reports it started, and lets it go on.
fn contain(
    config: &InitConfig,
    child: Pid,
    contained: OwnedFd,
    status: &File,
) -> Result<(), InitError> {
    let pid = child.as_raw().to_string();
    for procs in &config.cgroup_procs {
        OpenOptions::new()
            .write(true)
            .open(procs)
            .and_then(|mut f| f.write_all(pid.as_bytes()))
            .step(|| format!("moving the sandbox into cgroup {}", procs.display()))?;
    }
    let identity = ProcessIdentity::of(child.as_raw())
        .step(|| "reading the sandbox process's start time".into())?;
    let started = Report::Started {
        pid: identity.pid,
        start_time: identity.start_time,
    };
    let _ = (&*status).write_all(&started.to_line());
    File::from(contained)
        .write_all(b"1")
        .step(|| "releasing the sandbox's first process".into())
}

/// The sandbox's first process: builds the sandbox around itself and becomes the agent.
fn run_pid1(config: &InitConfig, listener: &OwnedFd, contained: OwnedFd) -> InitError {
    if let Err(e) = prepare_pid1(config, listener, contained) {
        return e;
    }
    let argv: Result<Vec<CString>, _> = std::iter::once("tether-agent")
        .chain(AGENT_ARGS)
        .chain(config.agent_args.iter().map(String::as_str))
        .map(CString::new)
        .collect();
    let Ok(argv) = argv else {
        return InitError::Config("an agent argument holds a NUL byte".into());
    };
    let env: Result<Vec<CString>, _> = config
        .env
        .iter()
        .map(|e| CString::new(e.as_str()))
        .collect();
    let Ok(env) = env else {
        return InitError::Config("an environment variable holds a NUL byte".into());
    };
    let path = CString::new(AGENT_PATH).expect("agent path holds no NUL");
    let Err(errno) = execve(&path, &argv, &env);
    InitError::Sys {
        what: format!(
            "starting the agent {} (bound from {}; it must be a static Linux executable)",
            AGENT_PATH,
            config.agent_binary.display()
        ),
        errno,
    }
}

fn prepare_pid1(
    config: &InitConfig,
    listener: &OwnedFd,
    contained: OwnedFd,
) -> Result<(), InitError> {
    namespaces::enter_sandbox_namespaces(config.network)?;
    sethostname(&config.id).step(|| format!("setting the hostname to {}", config.id))?;
    if config.network != NetworkPolicy::Host {
        net::bring_up_loopback()?;
    }
    rootfs::assemble(config)?;
    rootfs::enter(&config.layout.root())?;
    chdir(WORKSPACE).step(|| format!("changing into {WORKSPACE}"))?;

    // Nothing of the sandbox may run before the monitor has put this process in its cgroup.
    let mut byte = [0u8; 1];
    let read = File::from(contained).read(&mut byte);
    if !matches!(read, Ok(1)) {
        let cause = read
            .err()
            .unwrap_or_else(|| io::Error::other("the monitor exited first"));
        return Err(cause).step(|| "waiting to be moved into the sandbox's cgroup".into());
    }
    namespaces::enter_cgroup_namespace()?;

    caps::restrict()?;
    dup2(listener.as_raw_fd(), AGENT_LISTEN_FD)
        .step(|| "handing the agent socket to fd 3".into())?;
    // dup2 onto itself (the socket may already be fd 3) leaves close-on-exec set.
    fcntl(AGENT_LISTEN_FD, FcntlArg::F_SETFD(FdFlag::empty()))
        .step(|| "keeping the agent socket open across exec".into())?;
    sys::cloexec_from(AGENT_LISTEN_FD + 1).step(|| "closing inherited descriptors".into())?;
    sys::reset_sigpipe().step(|| "restoring SIGPIPE's default action".into())?;
    // Last, so nothing above runs under them: no exec in the sandbox gains privileges, and
    // every process in it, the agent included, runs under the seccomp filter.
    sys::set_no_new_privs().step(|| "setting no_new_privs".into())?;
    if config.seccomp_unconfined {
        return Ok(());
    }
    seccomp::apply()
}

/// Reaps the sandbox's PID 1 and returns its status as an exit code, leaving a line in the log.
fn monitor(child: Pid) -> i32 {
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => {
                eprintln!("tether sandbox init: the sandbox's PID 1 exited with status {code}");
                return code;
            }
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                eprintln!("tether sandbox init: the sandbox's PID 1 was killed by {signal}");
                return 128 + signal as i32;
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("tether sandbox init: waiting for the sandbox's PID 1 failed: {e}");
                return 1;
            }
        }
    }
}

fn report_failure(status: &File, err: &InitError) {
    let report = Report::Failed {
        message: err.to_string(),
        unavailable: err.is_unavailable(),
    };
    eprintln!("tether sandbox init: {err}");
    let _ = (&*status).write_all(&report.to_line());
}
