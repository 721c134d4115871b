//! A network namespace held open for one run, so that the host can put a listener in it
//! before the guest starts: a model grant's `OPENAI_BASE_URL` (see
//! [`crate::DockerTier::run_granted_in_netns`]).
//!
//! A one-shot container gets its namespace when it starts, and its program runs at once: no
//! moment is left to add a listener. So a *holder* container starts first, with networking
//! disabled (only `lo`), as `nobody`, with no capabilities, read-only, under the same seccomp
//! profile, running nothing but `pause(2)` in a loop; the host joins its namespace for one
//! `bind` (stockade-runtime composes that from stockade-process); the guest container then
//! shares the holder's namespace (`NetworkMode: container:ID`) and finds the listener on its
//! loopback. The holder's image is built here from a 129-byte static ELF (no registry, no
//! shell, no libc), and is removed with the run's containers.

use bollard::models::{ContainerCreateBody, HostConfig};

use crate::spec::hardened_host;

/// The holder's image, built locally from its embedded root filesystem (`docker import`).
pub const HOLDER_IMAGE: &str = "stockade-netns-holder:1";

/// A static x86-64 ELF executable whose one instruction loop is `pause(); goto loop;`: an
/// ELF header, one `PT_LOAD` program header mapping the file read-and-execute at
/// `0x400000`, then `mov eax, 34; syscall; jmp -9`.
fn pause_elf() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const CODE: [u8; 9] = [0xb8, 0x22, 0, 0, 0, 0x0f, 0x05, 0xeb, 0xf7];
    let size = (64 + 56 + CODE.len()) as u64;
    let mut e = Vec::with_capacity(size as usize);
    e.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&0x3eu16.to_le_bytes()); // EM_X86_64
    e.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    e.extend_from_slice(&(BASE + 64 + 56).to_le_bytes()); // entry: the code
    e.extend_from_slice(&64u64.to_le_bytes()); // program headers right after this header
    e.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    e.extend_from_slice(&0u32.to_le_bytes()); // flags
    for half in [64u16, 56, 1, 0, 0, 0] {
        e.extend_from_slice(&half.to_le_bytes()); // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
    }
    e.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e.extend_from_slice(&5u32.to_le_bytes()); // PF_R | PF_X
    for word in [0, BASE, BASE, size, size, 0x1000] {
        e.extend_from_slice(&word.to_le_bytes()); // offset, vaddr, paddr, filesz, memsz, align
    }
    e.extend_from_slice(&CODE);
    e
}

/// The holder image's root filesystem: `/pause`, root-owned, 0555.
pub(crate) fn holder_tar() -> std::io::Result<Vec<u8>> {
    let elf = pause_elf();
    let mut header = tar::Header::new_gnu();
    header.set_size(elf.len() as u64);
    header.set_mode(0o555);
    header.set_uid(0);
    header.set_gid(0);
    header.set_entry_type(tar::EntryType::Regular);
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(&mut header, "pause", elf.as_slice())?;
    b.into_inner()
}

/// The holder container: the same hardening as a guest's, with almost nothing allowed.
pub(crate) fn holder_body(run_id: &str, expires: u64, uid: u32, gid: u32) -> ContainerCreateBody {
    let host = HostConfig { memory: Some(8 << 20), memory_swap: Some(8 << 20), pids_limit: Some(1), ..hardened_host() };
    ContainerCreateBody {
        image: Some(HOLDER_IMAGE.into()),
        cmd: Some(vec!["/pause".into()]),
        entrypoint: Some(Vec::new()),
        user: Some(format!("{uid}:{gid}")),
        labels: Some(crate::spec::labels(run_id, expires)),
        host_config: Some(host),
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on broken invariants")]
mod tests {
    #[test]
    fn g9_the_pause_binary_is_a_well_formed_static_executable() {
        let e = super::pause_elf();
        assert_eq!(e.len(), 129);
        assert_eq!(&e[..4], b"\x7fELF");
        // Entry point = where the code starts in the file, mapped at 0x400000.
        assert_eq!(u64::from_le_bytes(e[24..32].try_into().unwrap()), 0x40_0000 + 120);
        assert_eq!(&e[120..], &[0xb8, 0x22, 0, 0, 0, 0x0f, 0x05, 0xeb, 0xf7]);
        let tar = super::holder_tar().unwrap();
        assert!(tar.windows(5).any(|w| w == b"pause"));
    }
}
