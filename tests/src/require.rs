//! What a test needs from the machine beyond the workspace's binaries, and the one way it says
//! so when something is missing: the test fails naming what to install, and never passes
//! without having checked anything. `./test` at the repository root installs all of it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Rust target the static agent is built for.
pub(crate) const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

/// The Debian package that provides each program the tests run, where its name differs.
const PACKAGES: &[(&str, &str)] = &[
    ("busybox", "busybox-static"),
    ("chattr", "e2fsprogs"),
    ("mkfs.ext4", "e2fsprogs"),
    ("losetup", "util-linux"),
    ("ip", "iproute2"),
    ("pgrep", "procps"),
];

/// Fails the test with what is missing and the command that installs it.
#[track_caller]
pub fn missing(what: &str, install: &str) -> ! {
    panic!("{what} not found: run ./test (or {install})")
}

/// The Debian package that provides `program`.
fn package_of(program: &str) -> &str {
    PACKAGES
        .iter()
        .find(|(p, _)| *p == program)
        .map_or(program, |(_, package)| package)
}

/// `program` as found on `PATH`, if it is there and executable.
pub(crate) fn find(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The path of `program` (from a Debian package); fails the test when it is not installed.
#[track_caller]
pub fn tool(program: &str) -> PathBuf {
    // A match, not a closure: `#[track_caller]` then names the test's line in the panic.
    match find(program) {
        Some(path) => path,
        None => missing(program, &format!("apt-get install {}", package_of(program))),
    }
}

/// A command for `program`; fails the test when it is not installed.
#[track_caller]
pub fn command(program: &str) -> Command {
    Command::new(tool(program))
}

/// Debian's static busybox (busybox-static), which image tests copy into a root file system
/// with no C library: the dynamically linked one of the `busybox` package would not run there.
#[track_caller]
pub(crate) fn static_busybox() -> &'static Path {
    let path = Path::new("/bin/busybox");
    let install = "apt-get install busybox-static";
    let Ok(bytes) = std::fs::read(path) else {
        missing("/bin/busybox", install)
    };
    if !bytes.starts_with(b"\x7fELF") || has_interpreter(&bytes) {
        missing("a statically linked /bin/busybox", install)
    }
    path
}

/// Whether an ELF64 file names a program interpreter (a `PT_INTERP` program header), as every
/// dynamically linked executable does and a static one does not.
fn has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let (Some(phoff), Some(entsize), Some(count)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return false;
    };
    (0..usize::from(count)).any(|i| {
        usize::try_from(phoff)
            .ok()
            .map(|off| off + i * usize::from(entsize))
            .and_then(u32_at)
            == Some(PT_INTERP)
    })
}

/// The Rust standard library for [`MUSL_TARGET`], which building the static agent needs.
#[track_caller]
pub(crate) fn musl_target() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = match Command::new(&rustc).args(["--print", "sysroot"]).output() {
        Ok(out) => out,
        Err(e) => panic!("cannot run {rustc} --print sysroot ({e}): install Rust with rustup"),
    };
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
    let lib = Path::new(&sysroot).join("lib/rustlib").join(MUSL_TARGET);
    if !lib.is_dir() {
        missing(
            &format!("the Rust target {MUSL_TARGET}"),
            &format!("rustup target add {MUSL_TARGET}"),
        )
    }
}

/// Root, which some tests need (switching users, loop devices); fails the test otherwise.
#[track_caller]
pub fn root(why: &str) {
    if !nix::unistd::geteuid().is_root() {
        panic!("{why} needs root: run the tests as root (sudo ./test)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_dynamic_executables_from_static_ones() {
        // This test binary is dynamically linked (the default gnu target); a truncated header
        // or a non-ELF file names no interpreter.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(has_interpreter(&exe));
        assert!(!has_interpreter(&exe[..40]));
        assert!(!has_interpreter(b"#!/bin/sh\n"));
        // A static ELF: the same header with its program headers' types changed to PT_LOAD.
        let phoff = u64::from_le_bytes(exe[32..40].try_into().unwrap()) as usize;
        let size = usize::from(u16::from_le_bytes([exe[54], exe[55]]));
        let count = usize::from(u16::from_le_bytes([exe[56], exe[57]]));
        let mut fixed = exe.clone();
        for i in 0..count {
            fixed[phoff + i * size..phoff + i * size + 4].copy_from_slice(&1u32.to_le_bytes());
        }
        assert!(!has_interpreter(&fixed));
    }

    #[test]
    fn names_the_package_to_install() {
        assert_eq!(package_of("busybox"), "busybox-static");
        assert_eq!(package_of("chattr"), "e2fsprogs");
        assert_eq!(package_of("skopeo"), "skopeo");
    }
}
