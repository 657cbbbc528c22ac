//! Finding the agent binary to put in an image, and checking that it can run in any image:
//! an x86_64 Linux ELF with no program interpreter, i.e. statically linked (musl). A glibc
//! build would start on the build machine and then fail in a busybox or Alpine image.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::error::ImageError;

/// Where cargo puts the static build, under a target directory.
const STATIC_BUILD: &str = "x86_64-unknown-linux-musl/release/tether-agent";
/// The variable naming the agent binary (shared with the relay and the tests).
const AGENT_ENV: &str = "TETHER_AGENT_BIN";

/// ELF constants (<https://refspecs.linuxfoundation.org/elf/gabi4+/ch4.eheader.html>).
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EM_X86_64: u16 = 62;
const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const PT_INTERP: u32 = 3;
/// The 64-bit ELF header's size, and the most program headers we read.
const EHDR_LEN: usize = 64;
const MAX_PHDRS: usize = 256;

/// The agent to bake: `explicit` (`--agent`), else `TETHER_AGENT_BIN`, else the static
/// build under a `target/` directory near the working directory or the running `tether`.
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf, ImageError> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    if let Some(path) = std::env::var_os(AGENT_ENV) {
        return Ok(PathBuf::from(path));
    }
    let candidates = candidates();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| ImageError::AgentNotFound {
            looked: std::iter::once(format!("--agent, {AGENT_ENV}"))
                .chain(candidates.iter().map(|p| p.display().to_string()))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// `target/<STATIC_BUILD>` under `CARGO_TARGET_DIR`, the working directory and its
/// ancestors, and the target directory holding the running executable.
fn candidates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    if let Ok(cwd) = std::env::current_dir() {
        dirs.extend(cwd.ancestors().map(|a| a.join("target")));
    }
    // target/debug/tether → target/
    if let Ok(exe) = std::env::current_exe() {
        dirs.extend(exe.parent().and_then(Path::parent).map(Path::to_path_buf));
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        let path = dir.join(STATIC_BUILD);
        if !out.contains(&path) {
            out.push(path);
        }
    }
    out
}

/// Fails unless `path` is a static x86_64 Linux executable.
pub fn check_static(path: &Path) -> Result<(), ImageError> {
    let bad = |reason: String| ImageError::BadAgent {
        path: path.to_path_buf(),
        reason,
    };
    let mut file = File::open(path).map_err(|e| bad(format!("it cannot be opened ({e})")))?;
    let mut ehdr = [0u8; EHDR_LEN];
    file.read_exact(&mut ehdr)
        .map_err(|_| bad("it is too short to be an executable".into()))?;
    if ehdr[..4] != ELF_MAGIC {
        return Err(bad("it is not an ELF executable".into()));
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let machine = u16_at(&ehdr, 0x12);
    if ehdr[4] != ELFCLASS64 || ehdr[5] != ELFDATA2LSB || machine != EM_X86_64 {
        return Err(bad(format!(
            "it is not an x86_64 executable (ELF machine {machine})"
        )));
    }
    let kind = u16_at(&ehdr, 0x10);
    if kind != ET_EXEC && kind != ET_DYN {
        return Err(bad(format!("it is not an executable (ELF type {kind})")));
    }
    let phoff = u64::from_le_bytes(ehdr[0x20..0x28].try_into().expect("8 bytes"));
    let phentsize = usize::from(u16_at(&ehdr, 0x36));
    let phnum = usize::from(u16_at(&ehdr, 0x38));
    if phentsize < 4 || phnum > MAX_PHDRS {
        return Err(bad("its program headers are malformed".into()));
    }
    let mut phdrs = vec![0u8; phentsize * phnum];
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(phoff))
        .and_then(|_| file.read_exact(&mut phdrs))
        .map_err(|_| bad("its program headers are truncated".into()))?;
    let dynamic = phdrs
        .chunks(phentsize)
        .any(|ph| u32::from_le_bytes(ph[..4].try_into().expect("4 bytes")) == PT_INTERP);
    if dynamic {
        return Err(bad(
            "it is dynamically linked (it names a program interpreter such as ld-linux), so it \
             would not start in images without the same C library"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_and_foreign_binaries_are_refused() {
        // The test binary itself is dynamically linked (the host's target).
        let exe = std::env::current_exe().unwrap();
        let err = check_static(&exe).unwrap_err().to_string();
        assert!(err.contains("dynamically linked"), "{err}");
        assert!(err.contains("x86_64-unknown-linux-musl"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("agent.sh");
        std::fs::write(&script, format!("#!/bin/sh\n{}", "echo hi\n".repeat(20))).unwrap();
        assert!(check_static(&script)
            .unwrap_err()
            .to_string()
            .contains("not an ELF"));
        assert!(check_static(&dir.path().join("none"))
            .unwrap_err()
            .to_string()
            .contains("cannot be opened"));
    }

    #[test]
    fn a_static_executable_passes() {
        // Debian's busybox-static, where installed (CI installs it for the image tests).
        let busybox = Path::new("/bin/busybox");
        let is_static = std::process::Command::new("file")
            .arg(busybox)
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("statically linked"));
        if is_static {
            check_static(busybox).unwrap();
        }
    }
}
