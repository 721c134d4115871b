//! Open raw and packet sockets.
//! Catalogue row: 18 (`research/process-tier.md` section 4).
use stockade_attacks::*;

fn main() {
    report("af_packet", syscall(libc::SYS_socket, [libc::AF_PACKET as u64, libc::SOCK_RAW as u64, 0x0300, 0, 0, 0]));
    report(
        "raw_icmp",
        syscall(libc::SYS_socket, [libc::AF_INET as u64, libc::SOCK_RAW as u64, libc::IPPROTO_ICMP as u64, 0, 0, 0]),
    );
}
