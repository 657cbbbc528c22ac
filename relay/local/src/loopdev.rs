//! The kernel's loop-device interface (`linux/loop.h`), which the local provider puts each
//! sandbox's disk image on: asking `/dev/loop-control` for a free or new device, binding a
//! backing file to a device, reading which file a device is bound to, and unbinding it.
//! Written from the header rather than generated from it, so building the relay needs no
//! libclang; the structures' layout is checked against the header by the tests below.
#![expect(
    unsafe_code,
    reason = "the loop ioctls have no safe wrapper; each block says why it is sound"
)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use nix::errno::Errno;

/// `/dev/loop-control`, which hands out free devices and makes new ones.
const CONTROL_PATH: &str = "/dev/loop-control";

// The ioctl numbers of `linux/loop.h`: plain constants, not `_IO`-encoded, hence `_bad`.
const LOOP_SET_FD: u16 = 0x4C00;
const LOOP_CLR_FD: u16 = 0x4C01;
const LOOP_GET_STATUS64: u16 = 0x4C05;
const LOOP_CONFIGURE: u16 = 0x4C0A;
const LOOP_CTL_ADD: u16 = 0x4C80;
const LOOP_CTL_GET_FREE: u16 = 0x4C82;

/// `LO_FLAGS_AUTOCLEAR`: the kernel unbinds the device when its last user closes it.
pub(super) const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `LO_NAME_SIZE`.
const NAME_BYTES: usize = 64;
/// `LO_KEY_SIZE`.
const KEY_BYTES: usize = 32;

/// `struct loop_info64`: a bound device's backing file and settings.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct LoopInfo64 {
    /// `st_dev` of the backing file.
    pub(super) lo_device: u64,
    /// `st_ino` of the backing file.
    pub(super) lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    pub(super) lo_flags: u32,
    lo_file_name: [u8; NAME_BYTES],
    lo_crypt_name: [u8; NAME_BYTES],
    lo_encrypt_key: [u8; KEY_BYTES],
    lo_init: [u64; 2],
}

impl LoopInfo64 {
    fn zeroed() -> LoopInfo64 {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; NAME_BYTES],
            lo_crypt_name: [0; NAME_BYTES],
            lo_encrypt_key: [0; KEY_BYTES],
            lo_init: [0; 2],
        }
    }
}

/// `struct loop_config`: what `LOOP_CONFIGURE` binds, in one call.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

mod ioctl {
    use super::{LoopConfig, LoopInfo64};
    use super::{
        LOOP_CLR_FD, LOOP_CONFIGURE, LOOP_CTL_ADD, LOOP_CTL_GET_FREE, LOOP_GET_STATUS64,
        LOOP_SET_FD,
    };

    nix::ioctl_none_bad!(ctl_get_free, LOOP_CTL_GET_FREE);
    nix::ioctl_write_int_bad!(ctl_add, LOOP_CTL_ADD);
    nix::ioctl_write_int_bad!(set_fd, LOOP_SET_FD);
    nix::ioctl_write_ptr_bad!(configure, LOOP_CONFIGURE, LoopConfig);
    nix::ioctl_read_bad!(get_status64, LOOP_GET_STATUS64, LoopInfo64);
    nix::ioctl_none_bad!(clr_fd, LOOP_CLR_FD);
}

/// An open `/dev/loop-control`.
pub(super) struct LoopControl(File);

impl LoopControl {
    pub(super) fn open() -> io::Result<LoopControl> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(CONTROL_PATH)
            .map(LoopControl)
    }

    /// The number of the lowest unbound device, made if there is none. Another process (or
    /// thread) asking at the same time is told the same number: binding it may still fail.
    pub(super) fn free(&self) -> io::Result<u32> {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and only reads the kernel's device list.
        let number = unsafe { ioctl::ctl_get_free(self.0.as_raw_fd()) }?;
        u32::try_from(number).map_err(|_| Errno::EINVAL.into())
    }

    /// Makes device `number`; `EEXIST` if it exists already.
    pub(super) fn add(&self, number: u32) -> io::Result<u32> {
        let arg = libc::c_int::try_from(number).map_err(|_| io::Error::from(Errno::EINVAL))?;
        // SAFETY: LOOP_CTL_ADD takes the device number by value; no memory is passed.
        let made = unsafe { ioctl::ctl_add(self.0.as_raw_fd(), arg) }?;
        u32::try_from(made).map_err(|_| Errno::EINVAL.into())
    }
}

/// An open loop device (`/dev/loopN`). Closing it lets an auto-clearing device unbind, once
/// nothing else (a mount) holds it.
pub(super) struct LoopDevice {
    file: File,
    path: PathBuf,
}

impl LoopDevice {
    /// Opens `/dev/loop<number>`.
    pub(super) fn open_number(number: u32) -> io::Result<LoopDevice> {
        LoopDevice::open(PathBuf::from(format!("/dev/loop{number}")))
    }

    /// Opens the loop device at `path`.
    pub(super) fn open(path: PathBuf) -> io::Result<LoopDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)?;
        Ok(LoopDevice { file, path })
    }

    pub(super) fn path(&self) -> &PathBuf {
        &self.path
    }

    /// Binds `backing` to this device, read-write, with `flags` (`LO_FLAGS_*`). `EBUSY` when
    /// the device is bound already or another opener holds it exclusively.
    ///
    /// `LOOP_CONFIGURE` (Linux 5.8) binds and sets the flags in one step, before the device
    /// is live; on older kernels it is `LOOP_SET_FD` alone and the flags are not set (setting
    /// them afterwards would freeze the live device's queue, 15-35 ms a create).
    pub(super) fn bind(&self, backing: &File, flags: u32) -> io::Result<()> {
        let fd = u32::try_from(backing.as_raw_fd()).map_err(|_| io::Error::from(Errno::EBADF))?;
        let mut info = LoopInfo64::zeroed();
        info.lo_flags = flags;
        let config = LoopConfig {
            fd,
            block_size: 0,
            info,
            reserved: [0; 8],
        };
        // SAFETY: `config` is a fully initialised loop_config (layout checked below) that
        // outlives the call; the kernel only reads it.
        match unsafe { ioctl::configure(self.file.as_raw_fd(), &config) } {
            Ok(_) => Ok(()),
            Err(Errno::EINVAL | Errno::ENOTTY) => {
                // SAFETY: LOOP_SET_FD takes a descriptor by value; `backing` stays open for
                // the call, and the kernel takes its own reference to the file.
                unsafe { ioctl::set_fd(self.file.as_raw_fd(), backing.as_raw_fd()) }?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// What the device is bound to; `ENXIO` when it is unbound.
    pub(super) fn status(&self) -> io::Result<LoopInfo64> {
        let mut info = LoopInfo64::zeroed();
        // SAFETY: `info` is a writable loop_info64 (layout checked below) that outlives the
        // call; the kernel writes exactly that structure.
        unsafe { ioctl::get_status64(self.file.as_raw_fd(), &mut info) }?;
        Ok(info)
    }

    /// Unbinds the device; one still open elsewhere (a mount in another mount namespace) is
    /// marked to unbind itself on its last close. `ENXIO` when it is unbound already.
    pub(super) fn unbind(&self) -> io::Result<()> {
        // SAFETY: LOOP_CLR_FD takes no argument.
        unsafe { ioctl::clr_fd(self.file.as_raw_fd()) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layout of `linux/loop.h` on every Linux ABI with 8-byte-aligned u64 (x86_64,
    /// aarch64): what `offsetof` gives for the header's structures.
    #[test]
    fn structures_match_the_kernel_header() {
        assert_eq!(size_of::<LoopInfo64>(), 232);
        assert_eq!(offset_of!(LoopInfo64, lo_device), 0);
        assert_eq!(offset_of!(LoopInfo64, lo_inode), 8);
        assert_eq!(offset_of!(LoopInfo64, lo_rdevice), 16);
        assert_eq!(offset_of!(LoopInfo64, lo_offset), 24);
        assert_eq!(offset_of!(LoopInfo64, lo_sizelimit), 32);
        assert_eq!(offset_of!(LoopInfo64, lo_number), 40);
        assert_eq!(offset_of!(LoopInfo64, lo_encrypt_type), 44);
        assert_eq!(offset_of!(LoopInfo64, lo_encrypt_key_size), 48);
        assert_eq!(offset_of!(LoopInfo64, lo_flags), 52);
        assert_eq!(offset_of!(LoopInfo64, lo_file_name), 56);
        assert_eq!(offset_of!(LoopInfo64, lo_crypt_name), 120);
        assert_eq!(offset_of!(LoopInfo64, lo_encrypt_key), 184);
        assert_eq!(offset_of!(LoopInfo64, lo_init), 216);
        assert_eq!(size_of::<LoopConfig>(), 304);
        assert_eq!(offset_of!(LoopConfig, fd), 0);
        assert_eq!(offset_of!(LoopConfig, block_size), 4);
        assert_eq!(offset_of!(LoopConfig, info), 8);
        assert_eq!(offset_of!(LoopConfig, reserved), 240);
    }

    /// The same layout from the header itself, when a C compiler and the kernel's headers are
    /// installed (on a bare machine they are not, and the relay must build there).
    #[test]
    fn structures_match_the_installed_header() {
        let header = std::path::Path::new("/usr/include/linux/loop.h");
        let cc = which("cc");
        let (true, Some(cc)) = (header.exists(), cc) else {
            return eprintln!("skipped: needs cc and {}", header.display());
        };
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("layout.c");
        let program = dir.path().join("layout");
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <linux/loop.h>\n\
             #define O(t, f) printf(\"%zu \", offsetof(struct t, f))\nint main(void) {\n\
             printf(\"%zu %zu \", sizeof(struct loop_info64), sizeof(struct loop_config));\n",
        );
        let info_fields = [
            "lo_device",
            "lo_inode",
            "lo_rdevice",
            "lo_offset",
            "lo_sizelimit",
            "lo_number",
            "lo_encrypt_type",
            "lo_encrypt_key_size",
            "lo_flags",
            "lo_file_name",
            "lo_crypt_name",
            "lo_encrypt_key",
            "lo_init",
        ];
        for field in info_fields {
            c.push_str(&format!("O(loop_info64, {field});\n"));
        }
        for field in ["fd", "block_size", "info", "__reserved"] {
            c.push_str(&format!("O(loop_config, {field});\n"));
        }
        c.push_str("return 0;\n}\n");
        std::fs::write(&source, c).unwrap();
        let built = std::process::Command::new(cc)
            .arg(&source)
            .arg("-o")
            .arg(&program)
            .status()
            .unwrap();
        assert!(built.success());
        let out = std::process::Command::new(&program).output().unwrap();
        let from_header: Vec<usize> = String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        let ours = vec![
            size_of::<LoopInfo64>(),
            size_of::<LoopConfig>(),
            offset_of!(LoopInfo64, lo_device),
            offset_of!(LoopInfo64, lo_inode),
            offset_of!(LoopInfo64, lo_rdevice),
            offset_of!(LoopInfo64, lo_offset),
            offset_of!(LoopInfo64, lo_sizelimit),
            offset_of!(LoopInfo64, lo_number),
            offset_of!(LoopInfo64, lo_encrypt_type),
            offset_of!(LoopInfo64, lo_encrypt_key_size),
            offset_of!(LoopInfo64, lo_flags),
            offset_of!(LoopInfo64, lo_file_name),
            offset_of!(LoopInfo64, lo_crypt_name),
            offset_of!(LoopInfo64, lo_encrypt_key),
            offset_of!(LoopInfo64, lo_init),
            offset_of!(LoopConfig, fd),
            offset_of!(LoopConfig, block_size),
            offset_of!(LoopConfig, info),
            offset_of!(LoopConfig, reserved),
        ];
        assert_eq!(ours, from_header);
    }

    fn which(program: &str) -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    }
}
